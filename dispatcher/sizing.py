"""Byte-exact per-rank workspace size of FlashInfer's MoE all-to-all, for every release that has it.

Two layouts exist (sources and versions: ``docs/sizing.md``); the real functions JIT-compile a
CUDA module and refuse to run without a GPU, so both are re-implemented here to price caps anywhere.

``moe_a2a`` (flashinfer 0.6.0 - 0.7.2.post1): ``moe_a2a_get_workspace_size_per_rank``, used by
``flashinfer.comm.MoeAlltoAll``, by SGLang, and by 0.7.2's ``flashinfer.moe_ep.NVLinkOneSidedAlltoAll``
(``csrc/trtllm_moe_alltoall.cu: calculateOffsets``). Every region starts 128-byte aligned::

    flag | local token counter | send_counters[E] | recv_counters[E]      -> A(8 + 8E)
    dispatch completion flags[E]                                         -> A(4E)
    combine completion flags[E]                                          -> A(4E)
    topk_target_ranks int32[M * kMaxTopK]                                -> A(4 K M)
    topk_send_indices int32[M * kMaxTopK]                                -> A(4 K M)
    EPLB gathered stats int32[E * S]            (0.6.16+)                -> A(4 E S)
    dispatch payloads (E * M * D)                                        -> A(E M D)
    combine payload   (E * M * C)                                        -> A(E M C)

``nvlink_one_sided`` (flashinfer 0.7.4): ``moe_a2a_get_workspace_layout`` behind
``flashinfer.moe_ep.NVLinkOneSidedAlltoAll`` (``csrc/nvlink_one_sided_alltoall.cu:
calculateWorkspaceLayout``): 256-byte payload alignment, routing tables sized by the real top-k
instead of kMaxTopK, double-buffered receive counters, optional CFT counters and inbox, and an
optional Lamport region appended at the end.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from capwatch.dispatcher.vocabulary import align_up

ALIGNMENT_BYTES = 128  # kCachelineAlignment
MAX_EP_SIZE = 64  # kMaxRanks of the moe_a2a layout
INT32_MAX = (1 << 31) - 1  # FlashInfer casts max_num_tokens to int
# Bounds on a model no real deployment exceeds (the largest MoE models have hidden sizes of 7-16 K and
# a few hundred experts); past them an input is a typo, and pricing it would be wasted work.
MAX_HIDDEN_SIZE = 1 << 16
MAX_NUM_EXPERTS = 1 << 12

# Every flashinfer-python release that ships the MoE A2A, oldest first.
SUPPORTED_FLASHINFER_VERSIONS: tuple[str, ...] = (
    "0.6.0", "0.6.1", "0.6.2", "0.6.3", "0.6.4", "0.6.5", "0.6.6",
    "0.6.7", "0.6.7.post1", "0.6.7.post2", "0.6.7.post3",
    "0.6.8", "0.6.8.post1", "0.6.9", "0.6.10", "0.6.10.post1",
    "0.6.11", "0.6.11.post1", "0.6.11.post2", "0.6.11.post3",
    "0.6.12", "0.6.13", "0.6.14", "0.6.15", "0.6.15.post1",
    "0.6.16", "0.6.16.post1", "0.6.16.post2", "0.6.16.post3", "0.6.16.post4",
    "0.6.17", "0.6.18", "0.6.18.post1",
    "0.7.0", "0.7.0.post1", "0.7.1", "0.7.2", "0.7.2.post1", "0.7.4",
)
LATEST_FLASHINFER_VERSION = SUPPORTED_FLASHINFER_VERSIONS[-1]
# The newest release with ``MoeAlltoAll`` / ``moe_a2a_get_workspace_size_per_rank``: what SGLang
# (and capwatch's dispatcher) call, so the default wherever a version is left out.
DEFAULT_FLASHINFER_VERSION = "0.7.2.post1"

LAYOUT_MOE_A2A = "moe_a2a"
LAYOUT_NVLINK_ONE_SIDED = "nvlink_one_sided"


class SizingError(ValueError):
    """Input that FlashInfer would reject, or that cannot describe a real deployment."""


def _release(version: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?", version.strip())
    if not match:
        raise SizingError(f"flashinfer version {version!r} is not of the form X.Y.Z[.postN]")
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]


@dataclass(frozen=True)
class FlashInferVersion:
    """What one flashinfer release's A2A accepts, as far as sizing is concerned."""

    version: str
    max_top_k: int  # kMaxTopK: sizes the moe_a2a top-k regions and bounds top_k
    supports_eplb_stats: bool
    requires_divisible_experts: bool
    layout: str = LAYOUT_MOE_A2A
    max_ep_size: int = MAX_EP_SIZE
    # NVLinkOneSidedAlltoAll (0.7.4) specialises its kernels for these top-k values only.
    supported_top_k: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, version: str | None = None) -> "FlashInferVersion":
        return _parse_version((version or DEFAULT_FLASHINFER_VERSION).strip())

    @classmethod
    def _build(cls, version: str) -> "FlashInferVersion":
        if version not in SUPPORTED_FLASHINFER_VERSIONS:
            _release(version)  # a malformed string gets the format message
            raise SizingError(
                f"flashinfer {version} has no MoE A2A capwatch knows; supported: "
                f"{SUPPORTED_FLASHINFER_VERSIONS[0]} ... {LATEST_FLASHINFER_VERSION} "
                f"({', '.join(SUPPORTED_FLASHINFER_VERSIONS)})"
            )
        release = _release(version)
        nvlink_one_sided = release >= (0, 7, 4)
        return cls(
            version=version,
            max_top_k=8 if release < (0, 6, 8) else 22,
            supports_eplb_stats=release >= (0, 6, 16),
            # 0.6.16 allowed non-divisible expert counts; 0.7.4's moe_ep base class forbids them again.
            requires_divisible_experts=release < (0, 6, 16) or nvlink_one_sided,
            layout=LAYOUT_NVLINK_ONE_SIDED if nvlink_one_sided else LAYOUT_MOE_A2A,
            max_ep_size=256 if nvlink_one_sided else MAX_EP_SIZE,
            supported_top_k=(1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 22) if nvlink_one_sided else None,
        )


@functools.lru_cache(maxsize=None)
def _parse_version(version: str) -> FlashInferVersion:
    # Cached: the advisor prices many caps per request, each parsing the same version string.
    return FlashInferVersion._build(version)


def _integer(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizingError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        qualifier = "positive" if minimum == 1 else f">= {minimum}"
        raise SizingError(f"{name} must be {qualifier}, got {value}")
    return value


def check_positive(name: str, value: int) -> int:
    return _integer(name, value, 1)


_positive = check_positive


def check_ep_size(ep_size: int, version: FlashInferVersion) -> int:
    _positive("ep_size", ep_size)
    if ep_size > version.max_ep_size:
        raise SizingError(
            f"ep_size {ep_size} exceeds flashinfer {version.version}'s limit of {version.max_ep_size} ranks"
        )
    return ep_size


def check_max_num_tokens(max_num_tokens: int, name: str = "max_num_tokens (the per-rank cap)") -> int:
    _positive(name, max_num_tokens)
    if max_num_tokens > INT32_MAX:
        raise SizingError(f"{name} {max_num_tokens} does not fit FlashInfer's int32 token count")
    return max_num_tokens


def check_eplb_stats(eplb_stats_num_experts: int, version: FlashInferVersion) -> int:
    _integer("eplb_stats_num_experts", eplb_stats_num_experts, 0)
    if eplb_stats_num_experts and not version.supports_eplb_stats:
        raise SizingError(
            f"flashinfer {version.version} has no EPLB stats region (added in 0.6.16); "
            "drop eplb_stats_num_experts or pick a newer version"
        )
    return eplb_stats_num_experts


def check_routing(top_k: int, num_experts: int, ep_size: int, version: FlashInferVersion,
                  eplb_stats_num_experts: int = 0) -> None:
    """The routing checks FlashInfer applies at construction or first dispatch."""
    _positive("top_k", top_k)
    _positive("num_experts", num_experts)
    if top_k > version.max_top_k:
        raise SizingError(f"top_k {top_k} exceeds flashinfer {version.version}'s kMaxTopK of {version.max_top_k}")
    if version.supported_top_k is not None and top_k not in version.supported_top_k:
        raise SizingError(
            f"flashinfer {version.version}'s NVLinkOneSidedAlltoAll supports top_k in "
            f"{', '.join(map(str, version.supported_top_k))}; got {top_k}"
        )
    if top_k > num_experts:
        raise SizingError(f"top_k {top_k} exceeds num_experts {num_experts}")
    if num_experts < ep_size:
        raise SizingError(f"num_experts {num_experts} must be >= ep_size {ep_size}: every rank needs an expert")
    if version.requires_divisible_experts and num_experts % ep_size:
        raise SizingError(
            f"flashinfer {version.version} requires num_experts ({num_experts}) divisible by ep_size ({ep_size})"
        )
    if num_experts > MAX_NUM_EXPERTS:
        raise SizingError(f"num_experts {num_experts} exceeds {MAX_NUM_EXPERTS}, more than any real MoE model")
    # The stats region holds one counter per expert: more stats experts than experts is a typo.
    if eplb_stats_num_experts > num_experts:
        raise SizingError(f"eplb_stats_num_experts {eplb_stats_num_experts} must be <= num_experts {num_experts}")


@dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets (FlashInfer's metainfo) and sizes of one rank's ``moe_a2a`` workspace."""

    ep_size: int
    max_num_tokens: int
    dispatch_bytes_per_token: int
    combine_bytes_per_token: int
    eplb_stats_num_experts: int
    max_top_k: int
    send_counters_offset: int
    recv_counters_offset: int
    dispatch_completion_flags_offset: int
    combine_completion_flags_offset: int
    topk_target_ranks_offset: int
    topk_send_indices_offset: int
    eplb_gathered_stats_offset: int
    payload_offset: int  # == aligned aux bytes
    aux_bytes: int
    dispatch_region_bytes: int
    combine_region_bytes: int
    workspace_bytes_per_rank: int

    @property
    def metainfo(self) -> list[int]:
        """The 10 offsets in FlashInfer's metainfo order (FLAG_VAL ... PAYLOAD_DATA). Releases before
        0.6.16 have no EPLB entry: their metainfo is this without index 8."""
        return [
            0, 4, self.send_counters_offset, self.recv_counters_offset,
            self.dispatch_completion_flags_offset, self.combine_completion_flags_offset,
            self.topk_target_ranks_offset, self.topk_send_indices_offset,
            self.eplb_gathered_stats_offset, self.payload_offset,
        ]


def workspace_layout(
    ep_size: int,
    max_num_tokens: int,
    dispatch_bytes_per_token: int,
    combine_bytes_per_token: int,
    eplb_stats_num_experts: int = 0,
    flashinfer_version: str | None = None,
) -> WorkspaceLayout:
    """Per-rank ``moe_a2a`` layout for a cap of ``max_num_tokens`` tokens per rank (not across ranks)."""
    version = FlashInferVersion.parse(flashinfer_version)
    if version.layout != LAYOUT_MOE_A2A:
        raise SizingError(
            f"flashinfer {version.version} removed moe_a2a_get_workspace_size_per_rank and MoeAlltoAll; "
            "its NVLinkOneSidedAlltoAll is sized by nvlink_one_sided_layout() "
            f"(or pick <= {DEFAULT_FLASHINFER_VERSION})"
        )
    check_ep_size(ep_size, version)
    check_max_num_tokens(max_num_tokens)
    _positive("dispatch_bytes_per_token", dispatch_bytes_per_token)
    _positive("combine_bytes_per_token", combine_bytes_per_token)
    check_eplb_stats(eplb_stats_num_experts, version)

    max_top_k = version.max_top_k
    send_counters_offset = 8  # after the flag and the local token counter (4 B each)
    recv_counters_offset = send_counters_offset + 4 * ep_size
    dispatch_flags_offset = align_up(8 + 8 * ep_size, ALIGNMENT_BYTES)
    combine_flags_offset = dispatch_flags_offset + align_up(4 * ep_size, ALIGNMENT_BYTES)
    topk_target_ranks_offset = combine_flags_offset + align_up(4 * ep_size, ALIGNMENT_BYTES)
    topk_send_indices_offset = topk_target_ranks_offset + align_up(4 * max_top_k * max_num_tokens, ALIGNMENT_BYTES)
    eplb_stats_offset = topk_send_indices_offset + align_up(4 * max_top_k * max_num_tokens, ALIGNMENT_BYTES)
    aux_bytes = eplb_stats_offset + align_up(4 * ep_size * eplb_stats_num_experts, ALIGNMENT_BYTES)
    payload_offset = align_up(aux_bytes, ALIGNMENT_BYTES)
    dispatch_region_bytes = align_up(ep_size * max_num_tokens * dispatch_bytes_per_token, ALIGNMENT_BYTES)
    combine_region_bytes = align_up(ep_size * max_num_tokens * combine_bytes_per_token, ALIGNMENT_BYTES)
    return WorkspaceLayout(
        ep_size=ep_size,
        max_num_tokens=max_num_tokens,
        dispatch_bytes_per_token=dispatch_bytes_per_token,
        combine_bytes_per_token=combine_bytes_per_token,
        eplb_stats_num_experts=eplb_stats_num_experts,
        max_top_k=max_top_k,
        send_counters_offset=send_counters_offset,
        recv_counters_offset=recv_counters_offset,
        dispatch_completion_flags_offset=dispatch_flags_offset,
        combine_completion_flags_offset=combine_flags_offset,
        topk_target_ranks_offset=topk_target_ranks_offset,
        topk_send_indices_offset=topk_send_indices_offset,
        eplb_gathered_stats_offset=eplb_stats_offset,
        payload_offset=payload_offset,
        aux_bytes=aux_bytes,
        dispatch_region_bytes=dispatch_region_bytes,
        combine_region_bytes=combine_region_bytes,
        workspace_bytes_per_rank=payload_offset + dispatch_region_bytes + combine_region_bytes,
    )


def workspace_bytes_per_rank(
    ep_size: int,
    max_num_tokens: int,
    dispatch_bytes_per_token: int,
    combine_bytes_per_token: int,
    eplb_stats_num_experts: int = 0,
    flashinfer_version: str | None = None,
) -> int:
    """``moe_a2a_get_workspace_size_per_rank``, byte for byte."""
    return workspace_layout(
        ep_size, max_num_tokens, dispatch_bytes_per_token, combine_bytes_per_token,
        eplb_stats_num_experts, flashinfer_version,
    ).workspace_bytes_per_rank


# --- payload bytes per token -------------------------------------------------------------------

# The formats every capwatch component knows (the telemetry report validates against this tuple).
PAYLOAD_FORMATS: tuple[str, ...] = ("bf16", "fp16", "fp8", "nvfp4", "mxfp8")
# Formats flashinfer.moe_ep's MoEEpCommParams also sizes (QuantFormat MXFP4 and DeepSeekFp8).
EXTRA_PAYLOAD_FORMATS: tuple[str, ...] = ("mxfp4", "deepseek-fp8")
SIZING_PAYLOAD_FORMATS: tuple[str, ...] = PAYLOAD_FORMATS + EXTRA_PAYLOAD_FORMATS
# capwatch name -> flashinfer.fused_moe.QuantFormat member name (MoEEpCommParams.dispatch_format).
MOE_EP_QUANT_FORMATS: dict[str, str] = {
    "bf16": "BF16", "fp16": "FP16", "fp8": "FP8PerTensor", "deepseek-fp8": "DeepSeekFp8",
    "mxfp8": "MXFP8", "nvfp4": "NVFP4", "mxfp4": "MXFP4",
}
# Elements per block scale; the hidden size must be a whole number of blocks.
_SCALE_BLOCK = {"nvfp4": 16, "mxfp8": 32, "mxfp4": 32}
TOPK_ID_BYTES = 4  # int32 expert ids
TOPK_WEIGHT_BYTES = 4  # fp32 router weights


def check_payload_format(payload_format: str) -> str:
    if payload_format not in SIZING_PAYLOAD_FORMATS:
        raise SizingError(
            f"unknown payload format {payload_format!r}; choose one of {', '.join(SIZING_PAYLOAD_FORMATS)}"
        )
    return payload_format


def hidden_bytes_per_token(hidden_size: int, payload_format: str) -> int:
    """Bytes of the hidden-state payload (with its block scales) for one token.

    Same table as flashinfer 0.7.x ``moe_ep`` ``_DISPATCH_BYTES_PER_TOKEN``; block-scaled formats
    need whole blocks (the quantisers require them), so its ceilings are exact divisions here.
    """
    _positive("hidden_size", hidden_size)
    if hidden_size > MAX_HIDDEN_SIZE:
        raise SizingError(f"hidden_size {hidden_size} exceeds {MAX_HIDDEN_SIZE}, more than any real model")
    check_payload_format(payload_format)
    block = _SCALE_BLOCK.get(payload_format)
    if block and hidden_size % block:
        raise SizingError(
            f"{payload_format} carries one scale per {block} values: hidden_size {hidden_size} "
            f"must be a multiple of {block}"
        )
    if payload_format in ("bf16", "fp16"):
        return 2 * hidden_size
    if payload_format == "fp8":  # per-tensor scale: a scalar that does not travel with the tokens
        return hidden_size
    if payload_format == "deepseek-fp8":  # e4m3 values + one fp32 scale per 128-element block
        return hidden_size + 4 * -(-hidden_size // 128)
    if payload_format == "nvfp4":  # two e2m1 values per byte + one e4m3 scale per 16 elements
        return hidden_size // 2 + hidden_size // 16
    if payload_format == "mxfp8":  # one byte per value + one ue8m0 scale per 32 elements
        return hidden_size + hidden_size // 32
    return hidden_size // 2 + hidden_size // 32  # mxfp4: e2m1 pairs + one ue8m0 scale per 32


def routing_bytes_per_token(top_k: int) -> int:
    """int32 top-k ids + fp32 top-k weights, the two routing payloads."""
    _positive("top_k", top_k)
    return (TOPK_ID_BYTES + TOPK_WEIGHT_BYTES) * top_k


def dispatch_bytes_per_token(hidden_size: int, top_k: int, payload_format: str = "bf16") -> int:
    """Hidden payload + int32 top-k ids + fp32 top-k weights, as SGLang and TRT-LLM send them."""
    _positive("top_k", top_k)
    return hidden_bytes_per_token(hidden_size, payload_format) + routing_bytes_per_token(top_k)


def combine_bytes_per_token(hidden_size: int) -> int:
    """Combine sends the expert output back in bf16."""
    _positive("hidden_size", hidden_size)
    return 2 * hidden_size


# --- flashinfer 0.7.4: NVLinkOneSidedAlltoAll (moe_a2a_get_workspace_layout) --------------------

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
    _positive("num_sms", num_sms)
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
    _positive("top_k", top_k)
    if top_k > version.max_top_k:
        raise SizingError(f"top_k {top_k} exceeds kMaxTopK {version.max_top_k}")
    _integer("eplb_stats_num_experts", eplb_stats_num_experts, 0)
    _integer("extra_payload_bytes_per_token", extra_payload_bytes_per_token, 0)
    _integer("lamport_max_tokens", lamport_max_tokens, 0)
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
