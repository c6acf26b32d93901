"""FlashInfer's ``moe_a2a`` workspace layout (flashinfer 0.6.0 - 0.7.2.post1), byte for byte.

``moe_a2a_get_workspace_size_per_rank``, used by ``flashinfer.comm.MoeAlltoAll``, by SGLang, and by
0.7.2's ``flashinfer.moe_ep.NVLinkOneSidedAlltoAll`` (``csrc/trtllm_moe_alltoall.cu:
calculateOffsets``). The real function JIT-compiles a CUDA module and refuses to run without a GPU,
so it is re-implemented here to price caps anywhere. Every region starts 128-byte aligned::

    flag | local token counter | send_counters[E] | recv_counters[E]      -> A(8 + 8E)
    dispatch completion flags[E]                                         -> A(4E)
    combine completion flags[E]                                          -> A(4E)
    topk_target_ranks int32[M * kMaxTopK]                                -> A(4 K M)
    topk_send_indices int32[M * kMaxTopK]                                -> A(4 K M)
    EPLB gathered stats int32[E * S]            (0.6.16+)                -> A(4 E S)
    dispatch payloads (E * M * D)                                        -> A(E M D)
    combine payload   (E * M * C)                                        -> A(E M C)
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.caps import align_up
from capwatch.sizing.checks import SizingError, check_positive
from capwatch.sizing.flashinfer_releases import (
    ALIGNMENT_BYTES,
    DEFAULT_FLASHINFER_VERSION,
    LAYOUT_MOE_A2A,
    FlashInferVersion,
    check_ep_size,
    check_eplb_stats,
    check_max_num_tokens,
)


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
    check_positive("dispatch_bytes_per_token", dispatch_bytes_per_token)
    check_positive("combine_bytes_per_token", combine_bytes_per_token)
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
