"""FlashInfer 0.7.4's ``NVLinkOneSidedAlltoAll`` workspace layout (``moe_a2a_get_workspace_layout``,
``csrc/nvlink_one_sided_alltoall.cu: calculateWorkspaceLayout``), byte for byte: 256-byte payload
alignment, routing tables sized by the real top-k instead of kMaxTopK, double-buffered receive
counters, optional CFT counters and inbox, and an optional Lamport region appended at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from capwatch.sizing.caps import align_up
from capwatch.sizing.checks import SizingError, check_integer, check_positive
from capwatch.sizing.flashinfer_releases import ALIGNMENT_BYTES, FlashInferVersion, check_ep_size, check_max_num_tokens
from capwatch.sizing.payloads import hidden_bytes_per_token

NVLINK_PAYLOAD_ALIGNMENT = 256  # kWorkspaceAlignment
NVLINK_MAX_PAYLOADS = 4  # kMaxPayloads: hidden states, scales, expert ids, weights
CFT_COUNTER_STRIDE = 256  # kCftCounterStride
LAMPORT_MAX_RANKS = 64
LAMPORT_MAX_TOKENS_PER_RANK = 512
LAMPORT_NUM_THREADS = 128
LAMPORT_DISPATCH_BLOCKS_PER_SM = 6
LAMPORT_MIN_DEFAULT_MAX_TOKENS = 159
LAMPORT_MAX_DEFAULT_REGION_BYTES = 64 << 20
# dispatch format -> (Lamport payload format, hidden-size multiple it needs)
LAMPORT_FORMATS: dict[str, tuple[str, int]] = {
    "bf16": ("BF16", 8), "mxfp8": ("MXFP8", 256), "deepseek-fp8": ("FP8_BLOCK128", 512), "nvfp4": ("NVFP4", 256),
}


@dataclass(frozen=True)
class LamportRow:
    payload: int  # hidden-state bytes of one row
    scale: int  # scale bytes as received
    wire_scale: int  # scale bytes on the wire (MXFP8 scales travel as 16-bit lanes)


def lamport_row(payload_format: str, hidden_size: int) -> LamportRow:
    """``lamportRowBytes``: row geometry of a Lamport payload format."""
    if payload_format not in LAMPORT_FORMATS:
        raise SizingError(
            f"the Lamport transport does not carry {payload_format}; it takes "
            f"{', '.join(LAMPORT_FORMATS)}"
        )
    name, multiple = LAMPORT_FORMATS[payload_format]
    if not 0 < hidden_size <= 1 << 24 or hidden_size % multiple:
        raise SizingError(f"Lamport {name} rows need hidden_size % {multiple} == 0, got {hidden_size}")
    if payload_format == "bf16":
        return LamportRow(2 * hidden_size, 0, 0)
    if payload_format == "mxfp8":
        return LamportRow(hidden_size, hidden_size // 32, hidden_size // 16)
    if payload_format == "deepseek-fp8":
        return LamportRow(hidden_size, hidden_size // 32, hidden_size // 32)
    return LamportRow(hidden_size // 2, hidden_size // 16, hidden_size // 16)


def _topk_row_bytes(top_k: int) -> int:
    return 16 * ((top_k + 3) // 4)  # 16-byte vectors of top_k 4-byte words


def lamport_bytes_per_row(top_k: int, row: LamportRow, hidden_size: int) -> int:
    """``lamportBytesPerRow``: Lamport bytes per (source rank, token), padding aside."""
    landing = row.payload + row.wire_scale + 3 * _topk_row_bytes(top_k)
    recv = row.payload + row.scale + 2 * top_k * 4
    return landing + 2 * hidden_size + recv


def default_lamport_max_tokens(ep_size: int, num_sms: int, top_k: int, hidden_size: int,
                               payload_format: str, max_tokens_per_rank: int) -> int:
    """``_default_lamport_max_tokens`` capped by the capacity, as ``NVLinkOneSidedAlltoAll`` picks it."""
    check_positive("num_sms", num_sms)
    row = lamport_row(payload_format, hidden_size)
    vectors = (row.payload + row.wire_scale) // 16
    blocks_per_token = -(-vectors // LAMPORT_NUM_THREADS)
    below_one_wave = (LAMPORT_DISPATCH_BLOCKS_PER_SM * num_sms - 1) // blocks_per_token
    by_region_bytes = LAMPORT_MAX_DEFAULT_REGION_BYTES // (ep_size * lamport_bytes_per_row(top_k, row, hidden_size))
    limit = max(min(below_one_wave, LAMPORT_MAX_TOKENS_PER_RANK, by_region_bytes), LAMPORT_MIN_DEFAULT_MAX_TOKENS)
    return min(limit, max_tokens_per_rank)


@dataclass(frozen=True)
class NVLinkOneSidedLayout:
    """Offsets and capacities of one rank's 0.7.4 workspace (names follow ``MoeA2AMetaInfoIndex``)."""

    ep_size: int
    max_tokens_per_rank: int
    top_k: int
    eplb_stats_num_experts: int
    cft: bool
    dispatch_payload_offset: int
    dispatch_payload_bytes: int  # reserved capacity, alignment padding included
    combine_completion_flags_offset: int
    combine_input_offset: int
    combine_input_bytes: int
    combine_recv_bytes: int  # CFT inbox, 0 without CFT
    base_workspace_bytes: int  # WORKSPACE_SIZE before the Lamport regions
    lamport_max_tokens: int  # 0 without the Lamport transport
    lamport_bytes: int
    workspace_bytes_per_rank: int

    @property
    def aux_bytes(self) -> int:
        """Control and routing state: everything but payload capacity and the Lamport regions."""
        return self.base_workspace_bytes - self.dispatch_payload_bytes - self.combine_input_bytes \
            - self.combine_recv_bytes


def nvlink_one_sided_layout(
    ep_size: int,
    max_tokens_per_rank: int,
    top_k: int,
    hidden_size: int,
    payload_format: str = "bf16",
    eplb_stats_num_experts: int = 0,
    *,
    extra_payload_bytes_per_token: int = 0,
    cft: bool = False,
    low_precision_combine: bool = False,
    lamport_max_tokens: int = 0,
) -> NVLinkOneSidedLayout:
    """flashinfer 0.7.4 ``NVLinkOneSidedAlltoAll.__init__`` sizing, bf16 token dtype.

    ``cft`` and ``lamport_max_tokens`` are what the constructor settles collectively at run time
    (CFT needs CC 10.0+, CUDA 13.4+, a 615+ driver; Lamport needs CC 10.0/10.3/10.7 and picks its
    token limit from the SM count, see ``default_lamport_max_tokens``); 0/False = fence path only.
    """
    version = FlashInferVersion.parse("0.7.4")
    check_ep_size(ep_size, version)
    check_max_num_tokens(max_tokens_per_rank, "max_tokens_per_rank")
    check_positive("top_k", top_k)
    if top_k > version.max_top_k:
        raise SizingError(f"top_k {top_k} exceeds kMaxTopK {version.max_top_k}")
    check_integer("eplb_stats_num_experts", eplb_stats_num_experts, 0)
    check_integer("extra_payload_bytes_per_token", extra_payload_bytes_per_token, 0)
    check_integer("lamport_max_tokens", lamport_max_tokens, 0)
    hidden_bytes = hidden_bytes_per_token(hidden_size, payload_format)
    if low_precision_combine and lamport_max_tokens:
        raise SizingError("the Lamport transport has no FP8 combine; drop one of them")

    def reserve(offset: int, size: int, alignment: int = 4) -> tuple[int, int]:
        start = align_up(offset, alignment)
        return start, start + size

    tokens = ep_size * max_tokens_per_rank
    dispatch_bytes = align_up(
        tokens * (hidden_bytes + 2 * top_k * 4 + extra_payload_bytes_per_token)
        + NVLINK_MAX_PAYLOADS * NVLINK_PAYLOAD_ALIGNMENT,
        NVLINK_PAYLOAD_ALIGNMENT,
    )
    combine_input_bytes = align_up(tokens * hidden_size * 2, NVLINK_PAYLOAD_ALIGNMENT)
    combine_recv_bytes = align_up(tokens * hidden_size * (1 if low_precision_combine else 2),
                                  NVLINK_PAYLOAD_ALIGNMENT) if cft else 0
    rank_counts = 4 * ep_size
    offset = 4  # flag
    _, offset = reserve(offset, 4)  # local token counter
    _, offset = reserve(offset, rank_counts)  # send counters
    _, offset = reserve(offset, 2 * rank_counts)  # receive counters, by round parity
    _, offset = reserve(offset, rank_counts, ALIGNMENT_BYTES)  # dispatch completion flags
    if cft:
        _, offset = reserve(offset, ep_size * CFT_COUNTER_STRIDE, CFT_COUNTER_STRIDE)
        _, offset = reserve(offset, ep_size * 8, ALIGNMENT_BYTES)
    _, offset = reserve(offset, max_tokens_per_rank * top_k * 4, ALIGNMENT_BYTES)  # target ranks
    _, offset = reserve(offset, max_tokens_per_rank * top_k * 4, ALIGNMENT_BYTES)  # target indices
    _, offset = reserve(offset, ep_size * eplb_stats_num_experts * 4, ALIGNMENT_BYTES)
    dispatch_offset, offset = reserve(offset, dispatch_bytes, NVLINK_PAYLOAD_ALIGNMENT)
    combine_flags_offset, offset = reserve(offset, rank_counts, ALIGNMENT_BYTES)
    if cft:
        _, offset = reserve(offset, tokens * CFT_COUNTER_STRIDE, CFT_COUNTER_STRIDE)
        _, offset = reserve(offset, tokens * 8, ALIGNMENT_BYTES)
    combine_input_offset, offset = reserve(offset, combine_input_bytes, NVLINK_PAYLOAD_ALIGNMENT)
    if cft:
        _, offset = reserve(offset, combine_recv_bytes, NVLINK_PAYLOAD_ALIGNMENT)
    base = offset

    lamport_tokens = min(lamport_max_tokens, LAMPORT_MAX_TOKENS_PER_RANK, max_tokens_per_rank)
    if lamport_tokens:
        if ep_size > LAMPORT_MAX_RANKS:
            raise SizingError(f"the Lamport transport supports at most {LAMPORT_MAX_RANKS} EP ranks")
        row = lamport_row(payload_format, hidden_size)
        rows = ep_size * lamport_tokens
        topk_row = _topk_row_bytes(top_k)
        aligned = lambda size: align_up(size, NVLINK_PAYLOAD_ALIGNMENT)  # noqa: E731
        landing = aligned(rows * row.payload) + aligned(rows * row.wire_scale) + aligned(rows * topk_row) \
            + 2 * aligned(rows * topk_row)
        regions = (
            ALIGNMENT_BYTES + lamport_tokens * 8,  # round state + per-slot source masks
            landing,
            aligned(rows * 2 * hidden_size),  # combine landing rows
            rows * (row.payload + row.scale + 2 * top_k * 4) + NVLINK_MAX_PAYLOADS * ALIGNMENT_BYTES,  # receive
        )
        for size in regions:
            _, offset = reserve(offset, size, NVLINK_PAYLOAD_ALIGNMENT)
    return NVLinkOneSidedLayout(
        ep_size=ep_size,
        max_tokens_per_rank=max_tokens_per_rank,
        top_k=top_k,
        eplb_stats_num_experts=eplb_stats_num_experts,
        cft=cft,
        dispatch_payload_offset=dispatch_offset,
        dispatch_payload_bytes=dispatch_bytes,
        combine_completion_flags_offset=combine_flags_offset,
        combine_input_offset=combine_input_offset,
        combine_input_bytes=combine_input_bytes,
        combine_recv_bytes=combine_recv_bytes,
        base_workspace_bytes=base,
        lamport_max_tokens=lamport_tokens,
        lamport_bytes=offset - base,
        workspace_bytes_per_rank=offset,
    )


# What 0.7.4 turns on at run time wherever every rank supports it, so no offline figure can include it (the
# constructor's probes and, for Lamport's token limit, the SM count every rank votes): ``capwatch plan`` names these.
OFFLINE_UNSIZED_REGIONS = {
    "cft": "CFT's combine receive inbox and counted-write counters (on where every rank has compute capability "
           ">= 10.0, a FlashInfer built against CUDA 13.4+ and a 615+ driver)",
    "lamport": "the Lamport transport's regions (on where every rank has compute capability 10.0, 10.3 or 10.7, "
               "at most 64 ranks and a BF16 combine; its token limit comes from the SM count)",
}


@dataclass(frozen=True)
class BuiltWorkspace:
    """What a built 0.7.4 ``NVLinkOneSidedAlltoAll`` says of its workspace: the truth where CFT or Lamport is on.

    ``workspace_bytes_per_rank``: ``int(metainfo[WORKSPACE_SIZE_INDEX])``, what it allocated per rank; ``cft``:
    ``metainfo[CFT_ENABLED_INDEX]`` (the layout has the CFT regions, whether or not its endpoints bound);
    ``lamport_max_tokens`` / ``lamport_bytes``: its ``lamport_max_tokens`` and ``_lamport_workspace_bytes`` (0: off).
    """

    workspace_bytes_per_rank: int
    cft: bool
    lamport_max_tokens: int
    lamport_bytes: int

    @property
    def sized_offline(self) -> bool:
        """Both optional regions off: the fence path, which ``nvlink_one_sided_layout`` sizes byte for byte alone."""
        return not self.cft and not self.lamport_max_tokens


def built_workspace(metainfo: Sequence[int], index: Mapping[str, int], lamport_max_tokens: int,
                    lamport_bytes: int) -> BuiltWorkspace:
    """A ``BuiltWorkspace`` from the object's fields: its metainfo values (``comm.metainfo.tolist()``), FlashInfer's
    metainfo indices (``vars(layout_constants())``, names without ``MOE_A2A_``), ``comm.lamport_max_tokens`` and
    ``comm._lamport_workspace_bytes``."""
    size, cft = int(metainfo[index["WORKSPACE_SIZE_INDEX"]]), bool(metainfo[index["CFT_ENABLED_INDEX"]])
    if lamport_max_tokens and int(metainfo[index["LAMPORT_MAX_NUM_TOKENS_INDEX"]]) != lamport_max_tokens:
        raise SizingError(f"the object's lamport_max_tokens {lamport_max_tokens} is not its metainfo's "
                          f"{int(metainfo[index['LAMPORT_MAX_NUM_TOKENS_INDEX']])}: flashinfer changed its layout")
    return BuiltWorkspace(size, cft, int(lamport_max_tokens), int(lamport_bytes))
