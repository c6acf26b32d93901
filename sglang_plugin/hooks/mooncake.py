"""Mooncake EP in SGLang (``--moe-a2a-backend mooncake``): what the plugin hooks, on 0.5.19 - 0.5.23.

SGLang builds one ``_MooncakeEPDispatcherImpl`` per ``MooncakeEPDispatcher`` (low-latency mode only; one per
micro-batch with two-batch overlap) and drives it like DeepEP's: ``dispatch_a(hidden_states, topk_output)``, whose
Mooncake EP dispatch asserts each rank's own batch fits the cap (SGLang checks nothing). After SGLang constructs one
(a ``HookRegistry`` hook on ``__init__``; the layer id from ``create_moe_dispatcher``) the plugin counts its
``dispatch_a`` (``hooks/local_batch.py``): an overflow is counted and reported before Mooncake EP's assertion.
The process-wide buffer (``EPBuffer.get_ep_buffer``, built at the first dispatch) is sized by Mooncake EP's own
``Buffer.get_ep_buffer_size_hint(T, hidden, ep_size, experts)``: the plugin asks it in the rank with SGLang's
arguments and reports that (``backends/reported.py``).
"""

from __future__ import annotations

import pkgutil

from capwatch.backends.reported import ReportedBuffer
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_plugin.hooks import local_batch
from capwatch.sglang_plugin.floors import mooncake as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.releases import VERIFIED, Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.mooncake import MOONCAKE as MOONCAKE_RULES

MOONCAKE = bind(MOONCAKE_RULES)  # with SGLang's variable and default for its cap

NAME = MOONCAKE.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.mooncake"
IMPL = f"{MODULE}._MooncakeEPDispatcherImpl"
INIT = Target(f"{IMPL}.__init__", ("group", "router_topk", "permute_fusion", "num_experts", "num_local_experts",
                                   "hidden_size", "params_dtype", "return_recv_hook"))
DISPATCH_A = Target(f"{IMPL}.dispatch_a", ("hidden_states", "topk_output"))
GET_BUFFER = Target(f"{IMPL}._get_buffer")
EP_BUFFER = Target(f"{MODULE}.EPBuffer.get_ep_buffer", ("group", "hidden_size", "param_bytes"))
LIBRARY = "mooncake.mooncake_ep_buffer"
SIZE_HINT = Target(f"{LIBRARY}.Buffer.get_ep_buffer_size_hint",
                   ("num_max_dispatch_tokens_per_rank", "hidden", "num_ranks", "num_experts"))


# SGLang's mooncake.py is one file in every verified release (tests/sglang/test_deepep_api_plugins.py: 0.5.19, 0.5.23).
ADAPTER = Adapter(releases=VERIFIED, hooked=(INIT, DISPATCH_A, GET_BUFFER, EP_BUFFER, SIZE_HINT,
                                             *local_batch.COMMON_TARGETS))
ADAPTERS = ADAPTER.by_release()


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why Mooncake EP cannot be instrumented, or None: its buffer module imports (SGLang imports it at the first
    dispatcher, which raises without it: the backend is unavailable), then every target and signature."""
    try:
        pkgutil.resolve_name(LIBRARY)
    except Exception as error:
        return library_missing("MooncakeEPDispatcher", LIBRARY, error,
                               "Mooncake with its EP (mooncake-transfer-engine)")
    return first_problem(adapter.targets())


def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    local_batch.register(session, source, INIT, adopt, "Mooncake EP")


def adopt(session, dispatcher, role: str, layer_id: int | None) -> None:
    """Count one low-latency dispatcher's ``dispatch_a``; both micro-batches' of the lowest layer lead."""
    local_batch.adopt_low_latency(session, dispatcher, MOONCAKE, role, layer_id,
                                  lambda: describe_buffer(session, dispatcher, role))


def describe_buffer(session, dispatcher, role: str) -> dict:
    """The process-wide buffer (built now if the first dispatch has not yet), counted once per process, with the
    bytes Mooncake EP's size hint gives for SGLang's arguments (what SGLang allocated)."""
    buffer = dispatcher._get_buffer()
    size_hint = pkgutil.resolve_name(SIZE_HINT.name)
    buffer_bytes = int(size_hint(dispatcher.num_max_dispatch_tokens_per_rank, dispatcher.hidden_size,
                                 dispatcher.group.size(), dispatcher.num_experts))
    reported = ReportedBuffer(buffer_bytes=buffer_bytes, dispatch_format="fp8")  # SGLang's use_fp8=True
    return local_batch.reported(session, role, MOONCAKE, buffer, buffer_bytes, reported)
