"""DeepEP's low-latency buffer layout: the RDMA bytes one rank registers for a per-rank cap T, byte for byte.

``deep_ep.Buffer.get_low_latency_rdma_size_hint(T, hidden, num_ranks, num_experts)`` of sgl-deep-ep 0.1.2 and
0.1.2.post1, re-implemented (the real one needs DeepEP's CUDA extension) and checked against each wheel's compiled
function (``tests/sizing/test_against_deepep.py``); docs/sizing.md ("DeepEP") has where it was read.

With H the hidden size, E the experts DeepEP is given (SGLang: routed + redundant + fused shared slots) and
s = H / 128 (one scale per 128 channels)::

    dispatch message  16 + max(2H, H + 4s)        an int4 header, then bf16 (or fp8 + fp32 scales)
    combine message   4s + 2H                     per-128-channel bf16x2 min/max, then bf16
    send buffer       max(T * dispatch, E * T * combine)        x 2 (odd/even)
    receive buffer    max(E * T * dispatch, E * T * combine)    x 2
    signaling         A(4E)                                     x 2 (A: up to 128 B)
    RDMA bytes        (total + 128) // 128 * 128   (the hint adds a 128 B step even to an aligned total)

The buffer is sized for bf16 whatever the dispatch dtype. The rank count is an argument but no term: the
same model costs the same bytes on 8 ranks or 64. The dispatch kernels are compiled for a fixed set of hidden
sizes (``LOW_LATENCY_HIDDEN_SIZES``); any other fails at the first dispatch (``Unsupported hidden``).
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.caps import align_up
from capwatch.sizing.checks import MAX_NUM_EXPERTS, SizingError, check_positive

# The hidden sizes sgl-deep-ep 0.1.2 and 0.1.2.post1 compile their low-latency dispatch and combine kernels
# for (the template instances ``internode_ll::dispatch<..., kHidden>`` in the wheels' _C.so; upstream DeepEP's
# ``SWITCH_HIDDEN`` lacks 3584).
LOW_LATENCY_HIDDEN_SIZES: tuple[int, ...] = (2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192)
# The low-latency dispatch counts tokens from one rank to another below DeepEP's FINISHED_SUM_TAG (1024); SGLang
# asserts num_max_dispatch_tokens_per_rank <= 1024 at start (``_DeepEPDispatcherImplBase.__init__``).
MAX_DISPATCH_TOKENS_PER_RANK = 1024
BUFFER_ALIGNMENT_BYTES = 128  # LEGACY_NUM_BUFFER_ALIGNMENT_BYTES
SIGNALING_ALIGNMENT_BYTES = 128
CHANNELS_PER_SCALE = 128
INT4_BYTES, BF16_BYTES, FLOAT_BYTES, BF162_BYTES, INT_BYTES = 16, 2, 4, 4, 4


@dataclass(frozen=True)
class LowLatencyLayout:
    """One rank's low-latency RDMA buffer: two (odd/even) send, receive and signaling buffers."""

    cap: int  # num_max_dispatch_tokens_per_rank
    hidden_size: int
    num_experts: int  # all experts DeepEP dispatches to (the group's, not this rank's)
    dispatch_message_bytes: int
    combine_message_bytes: int
    send_buffer_bytes: int  # each of the two
    receive_buffer_bytes: int
    signaling_buffer_bytes: int  # aligned
    total_bytes: int  # the layout's own sum
    rdma_bytes: int  # get_low_latency_rdma_size_hint: what SGLang registers with NVSHMEM


def check_low_latency_hidden_size(hidden_size: int) -> int:
    """SizingError unless DeepEP's low-latency kernels are compiled for ``hidden_size``."""
    check_positive("hidden_size", hidden_size)
    if hidden_size not in LOW_LATENCY_HIDDEN_SIZES:
        raise SizingError(
            f"DeepEP's low-latency kernels do not run hidden size {hidden_size}: sgl-deep-ep is compiled for "
            f"{', '.join(map(str, LOW_LATENCY_HIDDEN_SIZES))} only (another --moe-a2a-backend serves this model)")
    return hidden_size


def check_dispatch_cap(cap: int) -> int:
    """SizingError unless 1 <= cap <= 1024, the tokens per rank DeepEP's low-latency dispatch counts (an engine
    may assert the same at start: SGLang's words are ``sglang_engine/deepep.py`` ``check_cap``)."""
    check_positive("cap", cap)
    if cap > MAX_DISPATCH_TOKENS_PER_RANK:
        raise SizingError(f"cap {cap} is above {MAX_DISPATCH_TOKENS_PER_RANK}, the most tokens per rank DeepEP's "
                          "low-latency dispatch counts (its FINISHED_SUM_TAG)")
    return cap


def low_latency_layout(cap: int, hidden_size: int, num_experts: int) -> LowLatencyLayout:
    """``LowLatencyLayout(nullptr, cap, hidden, num_ranks, num_experts)`` and the size hint SGLang allocates."""
    check_dispatch_cap(cap)
    check_low_latency_hidden_size(hidden_size)
    check_positive("num_experts", num_experts)
    if num_experts > MAX_NUM_EXPERTS:
        raise SizingError(f"num_experts {num_experts} is beyond any real model (at most {MAX_NUM_EXPERTS})")
    scales = hidden_size // CHANNELS_PER_SCALE
    dispatch_message = INT4_BYTES + max(hidden_size * BF16_BYTES, hidden_size + scales * FLOAT_BYTES)
    combine_message = scales * BF162_BYTES + hidden_size * BF16_BYTES
    send = max(cap * dispatch_message, num_experts * cap * combine_message)
    receive = max(num_experts * cap * dispatch_message, num_experts * cap * combine_message)
    signaling = align_up(num_experts * INT_BYTES, SIGNALING_ALIGNMENT_BYTES)
    total = 2 * (send + receive + signaling)
    rdma = (total + BUFFER_ALIGNMENT_BYTES) // BUFFER_ALIGNMENT_BYTES * BUFFER_ALIGNMENT_BYTES
    return LowLatencyLayout(cap=cap, hidden_size=hidden_size, num_experts=num_experts,
                            dispatch_message_bytes=dispatch_message, combine_message_bytes=combine_message,
                            send_buffer_bytes=send, receive_buffer_bytes=receive, signaling_buffer_bytes=signaling,
                            total_bytes=total, rdma_bytes=rdma)


def low_latency_rdma_bytes(cap: int, hidden_size: int, num_experts: int) -> int:
    """``Buffer.get_low_latency_rdma_size_hint(cap, hidden, num_ranks, num_experts)`` (any num_ranks)."""
    return low_latency_layout(cap, hidden_size, num_experts).rdma_bytes
