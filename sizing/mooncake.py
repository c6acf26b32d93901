"""Mooncake EP's buffer (``--moe-a2a-backend mooncake``): its cap's rules and its payload per token.

SGLang sizes the buffer with Mooncake EP's own ``Buffer.get_ep_buffer_size_hint(T, hidden, ep_size, experts)``
(``token_dispatcher/mooncake.py`` ``EPBuffer.get_ep_buffer``), which is C++ (``mooncake.ep``): nothing here can
run it, but the rank can, so the plugin asks it there at the rank's cap (``sizing/reported.py``). SGLang reads
the cap with a raw ``get_int_env_var`` (not ``envs``), asserts it is at most 1024 and checks nothing at start-up;
Mooncake EP's dispatch asserts each rank's own batch fits. SGLang dispatches FP8 (``use_fp8=True``).
"""

from __future__ import annotations

from capwatch.sizing.backends import BackendCapRules

MAX_DISPATCH_TOKENS_PER_RANK = 1024  # Mooncake EP counts tokens below its FINISHED_SUM_TAG, as DeepEP does

MOONCAKE = BackendCapRules(
    "mooncake", max_cap_tokens=MAX_DISPATCH_TOKENS_PER_RANK,
    why_max=f"the engine asserts the cap <= {MAX_DISPATCH_TOKENS_PER_RANK} at start-up (Mooncake EP's "
            "FINISHED_SUM_TAG)",
    below_floor="Mooncake EP's dispatch assertion ends the rank below it (at CUDA-graph capture or the first full "
                "batch; nothing checks it at start-up)",
    eager_prefill_dispatched=True, local_batch_cap=True, overflow_outcome="Mooncake EP's assertion ends the rank",
    memory="EP buffer", sized_by="Mooncake EP's get_ep_buffer_size_hint, asked in the rank",
    mismatch_hint="check the experts and the group size the buffer was sized for")
