"""DeepGEMM Mega MoE (``--moe-a2a-backend megamoe``): its cap's rules and its payload per token.

The cap sizes DeepGEMM's symmetric buffer (``deep_gemm.get_symm_buffer_for_mega_moe``: ``SymmBuffer`` allocates
``_C.get_symm_buffer_size_for_mega_moe(ranks, experts, T, top_k, hidden, intermediate, mma_type, activation,
shared experts)`` bytes). That size is compiled C++ (sgl-deep-gemm 0.2.3.post2, the release SGLang 0.5.23 pins:
``csrc/apis/mega_moe.hpp``, not shipped; its layout ``include/deep_gemm/layout/mega_moe.cuh`` is, but the ring
buffers' token counts come from ``heuristics/mega_moe.hpp`` and the SM count, which SGLang keys its cache on), and
the library needs CUDA: nothing here runs it. A rank reports the bytes its built buffer holds
(``SymmBuffer.buffer.nbytes``, ``sizing/reported.py``).

SGLang reads the cap per call (``layers/moe/mega_moe.py``): ``should_use_mega_moe`` sends an eager step whose R
(the largest local batch of the DP group) exceeds it to the slower non-mega MoE path, with no error and no log
line; a captured CUDA graph takes the mega path whatever its batch, and ``run_mega_routed_experts`` asserts each
rank's own batch fits. So an eager prefill above the cap only falls back: the floor is the captured graphs' batches
(no prefill chunk term, ``eager_prefill_dispatched`` False). DeepGEMM bounds the cap: its shared-expert L2 pool has ``kNumMaxSharedL2Blocks`` (2^15)
blocks of ``kMinCandidateBlockM`` (8) tokens (``Workspace``'s assertion), and at most ``kNumMaxRanks`` (72) ranks.
"""

from __future__ import annotations

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.checks import SizingError, check_positive

MAX_SHARED_L2_BLOCKS = 1 << 15  # MegaMoESignals::kNumMaxSharedL2Blocks
MIN_BLOCK_M = 8  # kMinCandidateBlockM: one shared L2 block per 8 tokens of the cap
MAX_TOKENS_PER_RANK = MAX_SHARED_L2_BLOCKS * MIN_BLOCK_M
MAX_RANKS = 72  # layout::kNumMaxRanks
# SGLang's check_mega_moe_shapes: hidden a multiple of 16 x the scale group (16 for nvfp4xnvfp4, 32 otherwise).
HIDDEN_ALIGNMENT = 256

MEGAMOE = BackendCapRules(
    "megamoe", max_cap_tokens=MAX_TOKENS_PER_RANK,
    why_max=f"DeepGEMM's Mega MoE workspace holds at most {MAX_SHARED_L2_BLOCKS} shared-expert blocks of "
            f"{MIN_BLOCK_M} tokens per rank (its Workspace assertion)",
    below_floor="a captured CUDA graph above it takes the mega path anyway and run_mega_routed_experts's assertion "
                "ends the rank at capture; an eager step above it falls back to the slower non-mega path",
    local_batch_cap=True,  # the assertion (the one refusal) checks each rank's own batch; the fallback, the group's R
    over_cap_fallback="falls back to the slower non-mega MoE path",
    overflow_outcome="the engine's assertion (run_mega_routed_experts) ends the rank",
    memory="symmetric buffer", sized_by="the bytes DeepGEMM's SymmBuffer reported",
    mismatch_hint="DeepGEMM rebuilds the buffer when the cap, the model's shapes, the MMA type or the SM count change")


def check_hidden_size(hidden_size: int) -> int:
    """SizingError unless SGLang's Mega MoE takes ``hidden_size`` (a multiple of 256; 512 unless NVFP4)."""
    check_positive("hidden_size", hidden_size)
    if hidden_size % HIDDEN_ALIGNMENT:
        raise SizingError(f"DeepGEMM Mega MoE needs a hidden size that is a multiple of {HIDDEN_ALIGNMENT} (512 unless "
                          f"NVFP4), got {hidden_size}: use another --moe-a2a-backend for this model")
    return hidden_size
