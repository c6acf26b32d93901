"""DeepEP's normal-mode (high-throughput) buffers: what ``--deepep-mode auto`` allocates beside the low-latency one.

Normal mode has no token cap: SGLang sizes its buffers from DeepEP's dispatch and combine ``Config`` for the
group size (``Buffer.get_dispatch_config`` / ``get_combine_config``, or ``--deepep-config``), with
``Config.get_nvl_buffer_size_hint(hidden_bytes, num_ranks)`` (NVLink, intranode) and
``get_rdma_buffer_size_hint`` (RDMA, only past 8 ranks). Read from sgl-deep-ep 0.1.2 / 0.1.2.post1
(``deep_ep/buffers/legacy.py``: the config tables and ``Buffer.num_sms = 20``; the hints compiled from
DeepEP's ``csrc/legacy/config.hpp`` ``Config``, checked against the wheels' compiled code by
``tests/sizing/test_against_deepep.py``). With c = num_sms / 2 channels, n = min(ranks, 8) NVLink peers,
r = max(ranks / 8, 1) RDMA ranks, t the chunked receive tokens and h the hidden bytes::

    NVL   A(c n (2r + 3) 4 + c n t (h + 8 + 128 * 8 + 128 * 4 + 128 * 4))
    RDMA  0 up to 8 ranks, else A(c r (8 * 2 + 2) * 2 * 4 + 2 c r t' (h + 8 + 128 * 8 + 128 * 4 + 128 * 4 + 16))

(A: up to 128 B; t' is the RDMA receive tokens rounded up to a multiple of the RDMA send tokens.)
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.caps import align_up
from capwatch.sizing.checks import SizingError, check_positive

NUM_MAX_NVL_PEERS = 8  # LEGACY_NUM_MAX_NVL_PEERS: ranks one NVLink domain holds
DEFAULT_NUM_SMS = 20  # deep_ep.Buffer.num_sms; SGLang changes it only through --deepep-config
SOURCE_META_BYTES = 8  # internode::get_source_meta_bytes(): an rdma rank and an NVLink-rank bitmask, 2 int32
TOPK_INDEX_BYTES = 8  # topk_idx_t is int64
MAX_TOPK = 128  # the hints' own assumptions (kNumMaxTopK, kNumMaxScales)
MAX_SCALES = 128
INT_BYTES, FLOAT_BYTES, INT4_BYTES = 4, 4, 16
HINT_ALIGNMENT_BYTES = 128


@dataclass(frozen=True)
class NormalConfig:
    """DeepEP's ``Config(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)``, as its constructor leaves it
    (the RDMA receive tokens rounded up to a multiple of the RDMA send tokens)."""

    num_sms: int
    nvl_chunked_send_tokens: int
    nvl_chunked_recv_tokens: int
    rdma_chunked_send_tokens: int
    rdma_chunked_recv_tokens: int

    @classmethod
    def of(cls, num_sms: int, nvl_send: int, nvl_recv: int, rdma_send: int, rdma_recv: int) -> NormalConfig:
        """Raises SizingError where DeepEP's constructor asserts."""
        if num_sms < 0 or not 0 < nvl_send < nvl_recv or rdma_send <= 0 or rdma_recv <= 0:
            raise SizingError(f"DeepEP refuses Config({num_sms}, {nvl_send}, {nvl_recv}, {rdma_send}, {rdma_recv}): "
                              "it needs num_sms >= 0 and 0 < send tokens < receive tokens")
        rdma_recv = align_up(rdma_recv, rdma_send)
        if not rdma_send <= rdma_recv // 2:
            raise SizingError(f"DeepEP refuses Config(..., {rdma_send}, {rdma_recv}): the RDMA send tokens must be "
                              "at most half the receive tokens")
        return cls(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)


# deep_ep/buffers/legacy.py: Buffer.get_dispatch_config / get_combine_config, (nvl send, nvl recv, rdma send,
# rdma recv) per group size; num_sms is Buffer.num_sms.
DISPATCH_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
    24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128),
    96: (20, 480, 12, 128), 128: (20, 560, 12, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128),
}
COMBINE_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
    24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128),
    96: (1, 480, 8, 128), 128: (1, 560, 8, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128),
}


def default_configs(num_ranks: int, num_sms: int = DEFAULT_NUM_SMS) -> tuple[NormalConfig, NormalConfig]:
    """DeepEP's dispatch and combine configs for ``num_ranks``; SizingError where it has none (DeepEP asserts
    ``Unsupported number of EP ranks`` at the first normal dispatch)."""
    if num_ranks not in DISPATCH_CONFIGS:
        raise SizingError(
            f"DeepEP has no normal-mode config for {num_ranks} ranks (it has them for "
            f"{', '.join(map(str, DISPATCH_CONFIGS))}): --deepep-mode auto fails at the first prefill unless "
            "--deepep-config gives one; price --deepep-mode low_latency")
    return (NormalConfig.of(num_sms, *DISPATCH_CONFIGS[num_ranks]), NormalConfig.of(num_sms, *COMBINE_CONFIGS[num_ranks]))


def _check_ranks(config: NormalConfig, num_ranks: int) -> None:
    check_positive("num_ranks", num_ranks)
    if num_ranks > NUM_MAX_NVL_PEERS and num_ranks % NUM_MAX_NVL_PEERS:
        raise SizingError(f"DeepEP's normal mode spans NVLink domains of {NUM_MAX_NVL_PEERS} ranks: {num_ranks} "
                          "ranks is not a whole number of them")
    if num_ranks > NUM_MAX_NVL_PEERS and config.num_sms % 2:
        raise SizingError(f"DeepEP's normal mode across nodes needs an even SM count, not {config.num_sms}")


def nvl_buffer_bytes(config: NormalConfig, hidden_bytes: int, num_ranks: int) -> int:
    """``Config.get_nvl_buffer_size_hint(hidden_bytes, num_ranks)``."""
    _check_ranks(config, num_ranks)
    rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
    nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
    channels = config.num_sms // 2
    slots = channels * nvl_ranks * config.nvl_chunked_recv_tokens
    total = channels * nvl_ranks * (2 * rdma_ranks + 3) * INT_BYTES
    total += slots * (hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * TOPK_INDEX_BYTES + MAX_TOPK * FLOAT_BYTES
                      + MAX_SCALES * FLOAT_BYTES)
    return align_up(total, HINT_ALIGNMENT_BYTES)


def rdma_buffer_bytes(config: NormalConfig, hidden_bytes: int, num_ranks: int) -> int:
    """``Config.get_rdma_buffer_size_hint(hidden_bytes, num_ranks)``: 0 within one NVLink domain."""
    _check_ranks(config, num_ranks)
    if num_ranks <= NUM_MAX_NVL_PEERS:
        return 0
    rdma_ranks = num_ranks // NUM_MAX_NVL_PEERS
    channels = config.num_sms // 2
    slots = channels * rdma_ranks * config.rdma_chunked_recv_tokens
    total = channels * rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * INT_BYTES
    total += 2 * slots * (hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * TOPK_INDEX_BYTES + MAX_TOPK * FLOAT_BYTES
                          + MAX_SCALES * FLOAT_BYTES + INT4_BYTES)
    return align_up(total, HINT_ALIGNMENT_BYTES)


def normal_buffer_bytes(hidden_bytes: int, num_ranks: int,
                        configs: tuple[NormalConfig, NormalConfig] | None = None) -> tuple[int, int]:
    """(NVL, RDMA) bytes SGLang asks for normal mode: the larger over the dispatch and combine configs
    (``DeepEPBuffer.get_deepep_buffer``); DeepEP's defaults for the group size unless ``configs`` are given."""
    configs = configs or default_configs(num_ranks)
    return (max(nvl_buffer_bytes(config, hidden_bytes, num_ranks) for config in configs),
            max(rdma_buffer_bytes(config, hidden_bytes, num_ranks) for config in configs))
