"""FlashInfer's MegaMoE layer (``--moe-a2a-backend flashinfer_megamoe``): its cap's rules.

SGLang (0.5.20 on, ``layers/moe/flashinfer_megamoe.py``) builds one ``flashinfer.moe_ep.MoEEpMegaLayer`` per MoE
layer, lazily at its first forward (``_ensure_flashinfer_megamoe_layer``), with ``FleetParams(max_tokens_per_rank=
T)``; the fused kernel does the EP all-to-all itself, so SGLang's dispatcher is the standard one and every batch of
a rank, prefill and decode, reaches the kernel as that rank's own tokens. T is
``_resolve_max_tokens_per_rank()``: the variable when it is above 0, else derived from
``runtime_context.cutedsl_moe_max_num_tokens()`` (the largest of the prefill tokens, the piecewise prefill
CUDA-graph batch and the decode CUDA-graph batch x tokens per request), else 1024. A forward with more tokens than
T raises FlashInfer's ``MoEEpConfigError`` ("N tokens exceed max_tokens_per_rank=T"; the kernels' staging says
"token count N exceeds max_tokens_per_rank=T") and the rank dies; SGLang checks nothing at start-up.

The bytes: the layer's workspace (``MegaKernelBackend.prepare_workspace``, shared by the layers through
FlashInfer's workspace pool) is allocated on the NVSHMEM / symmetric heap by the kernel the quantisation picks
(DeepGEMM's ``get_symm_buffer_for_mega_moe`` in C++ for FP8 x FP4; CuteDSL sessions for NVFP4 / MXFP8 whose
staging depends on tuned knobs). No size function of FlashInfer's runs without the GPU, so a rank reports what its
built workspace holds (``sizing/reported.py``).
"""

from __future__ import annotations

from capwatch.sizing.backends import BackendCapRules

FLASHINFER_MEGAMOE = BackendCapRules(
    "flashinfer_megamoe", eager_prefill_dispatched=True, local_batch_cap=True,
    below_floor="FlashInfer's MegaMoE layer raises MoEEpConfigError at the first batch above it (the largest "
                "prefill, or the warm-up/capture of the largest decode graph); nothing checks it at start-up",
    overflow_outcome="FlashInfer's MegaMoE layer raises MoEEpConfigError and the rank dies",
    memory="MegaMoE workspace", sized_by="the bytes its built MegaMoE workspace holds",
    mismatch_hint="the workspace depends on the kernel (its quantisation), the experts, top-k and the tuned knobs")
