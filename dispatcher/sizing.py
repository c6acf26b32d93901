"""Byte-exact per-rank workspace size of FlashInfer's MoE all-to-all.

Re-implements ``moe_a2a_get_workspace_size_per_rank`` (flashinfer 0.6.0 - 0.7.2.post1,
``csrc/nv_internal/tensorrt_llm/thop/moeAlltoAllMeta.h``) so that caps can be priced on any
machine: the real function JIT-compiles a CUDA module and refuses to run without a GPU.

Layout of one rank's workspace (every region starts 128-byte aligned)::

    flag | local token counter | send_counters[E] | recv_counters[E]      -> A(8 + 8E)
    dispatch completion flags[E]                                         -> A(4E)
    combine completion flags[E]                                          -> A(4E)
    topk_target_ranks int32[M * kMaxTopK]                                -> A(4 K M)
    topk_send_indices int32[M * kMaxTopK]                                -> A(4 K M)
    EPLB gathered stats int32[E * S]                                     -> A(4 E S)
    dispatch payloads (E * M * D)                                        -> A(E M D)
    combine payload   (E * M * C)                                        -> A(E M C)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALIGNMENT_BYTES = 128
MAX_EP_SIZE = 64

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


class SizingError(ValueError):
    """Input that FlashInfer would reject, or that cannot describe a real deployment."""


def align_up(value: int, alignment: int = ALIGNMENT_BYTES) -> int:
    return -(-value // alignment) * alignment


def _release(version: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?", version.strip())
    if not match:
        raise SizingError(f"flashinfer version {version!r} is not of the form X.Y.Z[.postN]")
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]


@dataclass(frozen=True)
class FlashInferVersion:
    """What one flashinfer release's A2A accepts, as far as sizing is concerned."""

    version: str
    max_top_k: int  # kMaxTopK: sizes the top-k target-rank and send-index regions
    supports_eplb_stats: bool
    requires_divisible_experts: bool

    @classmethod
    def parse(cls, version: str | None = None) -> "FlashInferVersion":
        version = (version or LATEST_FLASHINFER_VERSION).strip()
        if version not in SUPPORTED_FLASHINFER_VERSIONS:
            _release(version)  # a malformed string gets the format message
            raise SizingError(
                f"flashinfer {version} has no MoE A2A capwatch knows; supported: "
                f"{SUPPORTED_FLASHINFER_VERSIONS[0]} ... {LATEST_FLASHINFER_VERSION}"
            )
        release = _release(version)
        return cls(
            version=version,
            max_top_k=8 if release < (0, 6, 8) else 22,
            supports_eplb_stats=release >= (0, 6, 16),
            # 0.6.16 allowed non-divisible expert counts; 0.7.4's moe_ep base class forbids them again.
            requires_divisible_experts=release < (0, 6, 16) or release >= (0, 7, 4),
        )


@dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets (FlashInfer's metainfo) and sizes of one rank's workspace."""

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
        """The 10 offsets in FlashInfer's metainfo order (FLAG_VAL ... PAYLOAD_DATA)."""
        return [
            0, 4, self.send_counters_offset, self.recv_counters_offset,
            self.dispatch_completion_flags_offset, self.combine_completion_flags_offset,
            self.topk_target_ranks_offset, self.topk_send_indices_offset,
            self.eplb_gathered_stats_offset, self.payload_offset,
        ]


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizingError(f"{name} must be an integer, got {value!r}")
    if value <= 0:
        raise SizingError(f"{name} must be positive, got {value}")
    return value


def workspace_layout(
    ep_size: int,
    max_num_tokens: int,
    dispatch_bytes_per_token: int,
    combine_bytes_per_token: int,
    eplb_stats_num_experts: int = 0,
    flashinfer_version: str | None = None,
) -> WorkspaceLayout:
    """Per-rank layout for a cap of ``max_num_tokens`` tokens per rank (not across ranks)."""
    _positive("ep_size", ep_size)
    if ep_size > MAX_EP_SIZE:
        raise SizingError(f"ep_size {ep_size} exceeds FlashInfer's limit of {MAX_EP_SIZE} ranks")
    _positive("max_num_tokens (the per-rank cap)", max_num_tokens)
    _positive("dispatch_bytes_per_token", dispatch_bytes_per_token)
    _positive("combine_bytes_per_token", combine_bytes_per_token)
    if isinstance(eplb_stats_num_experts, bool) or not isinstance(eplb_stats_num_experts, int) \
            or eplb_stats_num_experts < 0:
        raise SizingError(f"eplb_stats_num_experts must be an integer >= 0, got {eplb_stats_num_experts!r}")
    version = FlashInferVersion.parse(flashinfer_version)
    if eplb_stats_num_experts and not version.supports_eplb_stats:
        raise SizingError(
            f"flashinfer {version.version} has no EPLB stats region (added in 0.6.16); "
            "drop eplb_stats_num_experts or pick a newer version"
        )

    max_top_k = version.max_top_k
    send_counters_offset = 8  # after the flag and the local token counter (4 B each)
    recv_counters_offset = send_counters_offset + 4 * ep_size
    dispatch_flags_offset = align_up(8 + 8 * ep_size)
    combine_flags_offset = dispatch_flags_offset + align_up(4 * ep_size)
    topk_target_ranks_offset = combine_flags_offset + align_up(4 * ep_size)
    topk_send_indices_offset = topk_target_ranks_offset + align_up(4 * max_top_k * max_num_tokens)
    eplb_stats_offset = topk_send_indices_offset + align_up(4 * max_top_k * max_num_tokens)
    aux_bytes = eplb_stats_offset + align_up(4 * ep_size * eplb_stats_num_experts)
    payload_offset = align_up(aux_bytes)
    dispatch_region_bytes = align_up(ep_size * max_num_tokens * dispatch_bytes_per_token)
    combine_region_bytes = align_up(ep_size * max_num_tokens * combine_bytes_per_token)
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

PAYLOAD_FORMATS: tuple[str, ...] = ("bf16", "fp16", "fp8", "nvfp4", "mxfp8")
TOPK_ID_BYTES = 4  # int32 expert ids
TOPK_WEIGHT_BYTES = 4  # fp32 router weights


def hidden_bytes_per_token(hidden_size: int, payload_format: str) -> int:
    """Bytes of the hidden-state payload (with its scales) for one token."""
    _positive("hidden_size", hidden_size)
    if payload_format in ("bf16", "fp16"):
        return 2 * hidden_size
    if payload_format == "fp8":
        return hidden_size
    if payload_format == "nvfp4":  # two fp4 values per byte + one e4m3 scale per 16 elements
        return hidden_size // 2 + hidden_size // 16
    if payload_format == "mxfp8":  # one byte per value + one e8m0 scale per 32 elements
        return hidden_size + hidden_size // 32
    raise SizingError(f"unknown payload format {payload_format!r}; choose one of {', '.join(PAYLOAD_FORMATS)}")


def dispatch_bytes_per_token(hidden_size: int, top_k: int, payload_format: str = "bf16") -> int:
    """Hidden payload + int32 top-k ids + fp32 top-k weights, as SGLang and TRT-LLM send them."""
    _positive("top_k", top_k)
    return hidden_bytes_per_token(hidden_size, payload_format) + (TOPK_ID_BYTES + TOPK_WEIGHT_BYTES) * top_k


def combine_bytes_per_token(hidden_size: int) -> int:
    """Combine sends the expert output back in bf16."""
    _positive("hidden_size", hidden_size)
    return 2 * hidden_size
