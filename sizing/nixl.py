"""NIXL EP's buffer (``--moe-a2a-backend nixl``): its cap's rules.

SGLang sizes the RDMA buffer with NIXL EP's own ``Buffer.get_rdma_size_hint(T, hidden, max_ranks, max_experts)``
(``token_dispatcher/nixl.py`` ``NixlEPBuffer.get_nixl_buffer``: the group's largest elastic width and its experts),
which is C++ (``nixl_ep_cpp``): nothing here can run it, but the rank can, so the plugin asks it there at the
rank's cap (``sizing/reported.py``). The engine asserts the cap is at most 1024 and checks nothing else at
start-up; NIXL EP's dispatch asserts each rank's own batch fits (DeepEP's check, DeepEP's text).
"""

from __future__ import annotations

from capwatch.sizing.backends import BackendCapRules

MAX_DISPATCH_TOKENS_PER_RANK = 1024  # NIXL EP counts tokens below its FINISHED_SUM_TAG, as DeepEP does

NIXL = BackendCapRules(
    "nixl", max_cap_tokens=MAX_DISPATCH_TOKENS_PER_RANK,
    why_max=f"the engine asserts the cap <= {MAX_DISPATCH_TOKENS_PER_RANK} at start-up (NIXL EP's FINISHED_SUM_TAG)",
    below_floor="NIXL EP's dispatch assertion ends the rank below it (at CUDA-graph capture or the first full "
                "batch; nothing checks it at start-up)",
    eager_prefill_dispatched=True, local_batch_cap=True, overflow_outcome="NIXL EP's assertion ends the rank",
    memory="RDMA buffer", sized_by="NIXL EP's get_rdma_size_hint, asked in the rank",
    mismatch_hint="check the elastic EP width (--max-ep-size) the buffer was sized for")
