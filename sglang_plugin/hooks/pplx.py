"""pplx in SGLang (``--moe-a2a-backend pplx``): what the plugin hooks, on 0.5.19 – 0.5.23 (one adapter).

SGLang builds one ``_PplxDispatcherImpl`` per ``PplxDispatcher`` (low-latency mode only; one per micro-batch with
two-batch overlap) and drives it like DeepEP's low-latency one: ``dispatch_a(hidden_states, topk_output)`` asserts
each rank's own batch fits ``SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` (``num_tokens (N) exceeds
num_max_dispatch_tokens_per_rank (C); raise SGLANG_PPLX_...``), then dispatches through pplx-kernels' ``AllToAll``.
After SGLang constructs one (a ``HookRegistry`` hook on ``__init__``; the layer id from ``create_moe_dispatcher``)
the plugin counts its ``dispatch_a`` (``hooks/local_batch.py``): R is the rank's own batch, and an overflow is
counted and reported (the final report, bounded wait) and logged in one line naming the variable to set, before
SGLang's assertion ends the rank.

The ``AllToAll`` is one per process (``PplxAllToAllManager``, built by the first dispatch or ``set_quant_config``):
at the role's first dispatch the plugin asks the dispatcher for it (``_get_all_to_all``) and reports the arguments
SGLang built it with (the manager's key: attention-TP size, token and scale bytes; intranode or internode as SGLang
picks it, ``nnodes > 1``) and its bytes as capwatch prices them (``sizing/pplx.py``: pplx-kernels reports none).
"""

from __future__ import annotations

import pkgutil

from capwatch.backends.pplx import PplxAllToAll
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_plugin.floors import pplx as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.hooks import local_batch
from capwatch.sglang_plugin.releases import VERIFIED, Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.pplx import PPLX as PPLX_RULES
from capwatch.sizing.pplx import PplxConfig, pplx_plan

PPLX = bind(PPLX_RULES)  # with SGLang's variable and default for its cap

NAME = PPLX.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.pplx"
IMPL = f"{MODULE}._PplxDispatcherImpl"
INIT = Target(f"{IMPL}.__init__", ("group", "router_topk", "permute_fusion", "num_experts", "num_local_experts",
                                   "hidden_size", "params_dtype"))
DISPATCH_A = Target(f"{IMPL}.dispatch_a", ("hidden_states", "topk_output"))
GET_ALL_TO_ALL = Target(f"{IMPL}._get_all_to_all")
MANAGER = Target(f"{MODULE}.PplxAllToAllManager.get_all_to_all",
                 ("group", "max_num_tokens", "num_experts", "experts_per_token", "hidden_dim", "hidden_dim_bytes",
                  "hidden_dim_scale_bytes"))
GET_PARALLEL = Target("sglang.srt.runtime_context.get_parallel")  # .nnodes: SGLang's intranode/internode choice
LIBRARY = "pplx_kernels"


# SGLang's pplx.py keeps every target in every verified release (tests/sglang/test_pplx_plugin.py: 0.5.19, 0.5.22,
# 0.5.23)
ADAPTER = Adapter(releases=VERIFIED, hooked=(INIT, DISPATCH_A, GET_ALL_TO_ALL, MANAGER, GET_PARALLEL,
                                                *local_batch.COMMON_TARGETS))
ADAPTERS = ADAPTER.by_release()


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why pplx's dispatch cannot be instrumented, or None: pplx-kernels imports (SGLang's dispatcher refuses to
    build without it: the backend is unavailable), then every target and signature."""
    try:
        pkgutil.resolve_name(LIBRARY)
    except Exception as error:
        return library_missing("PplxDispatcher", LIBRARY, error, "pplx-kernels (github.com/perplexityai/pplx-kernels)")
    return first_problem(adapter.targets())


def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    local_batch.register(session, source, INIT, adopt, "pplx")


def adopt(session, dispatcher, role: str, layer_id: int | None) -> None:
    """Count one low-latency dispatcher's ``dispatch_a``; both micro-batches' of the lowest layer lead."""
    local_batch.adopt_low_latency(session, dispatcher, PPLX, role, layer_id,
                                  lambda: describe_all_to_all(session, dispatcher, role))


def describe_all_to_all(session, dispatcher, role: str) -> dict:
    """The process-wide ``AllToAll`` (built now if the first dispatch has not yet), counted once per process, with
    the arguments SGLang built it with and its bytes (pplx-kernels' allocations for them, ``sizing/pplx.py``)."""
    all_to_all = dispatcher._get_all_to_all()
    manager = pkgutil.resolve_name(MANAGER.name.rsplit(".", 1)[0])  # the class holding the AllToAll and its key
    (max_num_tokens, num_experts, _top_k, hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, world_size,
     dp_size) = manager._key
    transport = "internode" if pkgutil.resolve_name(GET_PARALLEL.name)().nnodes > 1 else "intranode"
    plan = pplx_plan(PplxConfig(world_size, dp_size, num_experts, hidden_dim, hidden_dim_bytes,
                                hidden_dim_scale_bytes, transport), max_num_tokens)
    return local_batch.reported(session, role, PPLX, all_to_all, plan.all_to_all_bytes,
                                PplxAllToAll(transport=transport, dp_size=int(dp_size),
                                             dispatch_dtype="fp8" if hidden_dim_scale_bytes else "bf16",
                                             params_bytes=int(dispatcher.params_bytes)))
