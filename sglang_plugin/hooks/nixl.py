"""NIXL EP in SGLang (``--moe-a2a-backend nixl``): what the plugin hooks, on 0.5.19 - 0.5.23.

SGLang builds one ``_NixlEPDispatcherImpl`` per ``NixlEPDispatcher`` (low-latency mode only; one per micro-batch
with two-batch overlap) and drives it like DeepEP's: ``dispatch_a(hidden_states, topk_output)``, whose NIXL EP
dispatch asserts each rank's own batch fits the cap (SGLang checks nothing). After SGLang constructs one (a
``HookRegistry`` hook on ``__init__``; the layer id from ``create_moe_dispatcher``) the plugin counts its
``dispatch_a`` (``hooks/local_batch.py``): an overflow is counted and reported before NIXL EP's assertion. The
process-wide buffer (``NixlEPBuffer.get_nixl_buffer``, built at the first dispatch) gets NIXL EP's own
``Buffer.get_rdma_size_hint(T, hidden, max_ranks, max_ranks x local experts)`` bytes: the plugin asks it in the
rank with SGLang's arguments and reports that (``backends/reported.py``). SGLang reaches ``nixl_ep.Buffer``
through ``_load_nixl_ep()`` at the first dispatcher from 0.5.21, with its own module's import before (``Buffer``,
``use_nixl``): one adapter each, the rest the same.
"""

from __future__ import annotations

import functools
import pkgutil
from dataclasses import dataclass

from capwatch.backends.reported import ReportedBuffer
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_plugin.hooks import local_batch
from capwatch.sglang_plugin.floors import nixl as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.releases import Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.nixl import NIXL as NIXL_RULES

NIXL = bind(NIXL_RULES)  # with SGLang's variable and default for its cap

NAME = NIXL.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.nixl"
IMPL = f"{MODULE}._NixlEPDispatcherImpl"
INIT = Target(f"{IMPL}.__init__", ("return_recv_hook",))
DISPATCH_A = Target(f"{IMPL}.dispatch_a", ("hidden_states", "topk_output"))
GET_BUFFER = Target(f"{IMPL}._get_buffer")
LOAD = Target(f"{MODULE}._load_nixl_ep")  # 0.5.21 on: (nixl_ep.Buffer, its topk index dtype), imported on call
USE_NIXL = Target(f"{MODULE}.use_nixl")  # 0.5.19 - 0.5.20: whether the module's own import of nixl_ep.Buffer worked
GET_PARALLEL = Target(f"{MODULE}.get_parallel")
BF16_DISPATCH = "SGLANG_NIXL_EP_BF16_DISPATCH"


@dataclass(frozen=True)
class Adapter:
    """How a family of SGLang releases reaches NIXL EP's ``Buffer`` (``load``: ``LOAD`` or ``USE_NIXL``)."""

    releases: tuple[str, ...]
    load: Target

    def targets(self) -> tuple[Target, ...]:
        return (INIT, DISPATCH_A, GET_BUFFER, self.load, GET_PARALLEL, *local_batch.COMMON_TARGETS)

    def library_buffer(self):
        """``nixl_ep.Buffer`` as SGLang imports it; ImportError where NIXL EP is not installed."""
        if self.load == LOAD:
            return pkgutil.resolve_name(LOAD.name)()[0]
        module = pkgutil.resolve_name(MODULE)
        if not module.use_nixl:
            raise ImportError(f"{MODULE} could not import nixl_ep (use_nixl is False)")
        return module.Buffer


LOADED = Adapter(releases=("0.5.21", "0.5.22", "0.5.23"), load=LOAD)
IMPORTED = Adapter(releases=("0.5.19", "0.5.20"), load=USE_NIXL)
# Verified on 0.5.19 and 0.5.23 (tests/sglang/test_deepep_api_plugins.py); 0.5.20 - 0.5.22 share their targets.
ADAPTERS = {release: adapter for adapter in (IMPORTED, LOADED) for release in adapter.releases}


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why NIXL EP cannot be instrumented, or None: every target and signature, then nixl_ep imports as the
    release imports it (SGLang's dispatcher raises without it: the backend is unavailable)."""
    found = first_problem(adapter.targets())
    if found is not None:
        return found
    try:
        buffer = adapter.library_buffer()
    except Exception as error:
        return library_missing("NixlEPDispatcher", "nixl_ep", error, "NIXL EP (nixl_ep, github.com/ai-dynamo/nixl)")
    if not callable(getattr(buffer, "get_rdma_size_hint", None)):
        return "nixl_ep.Buffer has no get_rdma_size_hint: a NIXL EP capwatch does not know"
    return None


def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    local_batch.register(session, source, INIT, functools.partial(adopt, adapter=adapter), "NIXL EP")


def adopt(session, dispatcher, role: str, layer_id: int | None, adapter: Adapter = LOADED) -> None:
    """Count one low-latency dispatcher's ``dispatch_a``; both micro-batches' of the lowest layer lead."""
    local_batch.adopt_low_latency(session, dispatcher, NIXL, role, layer_id,
                                  lambda: describe_buffer(session, dispatcher, role, adapter))


def describe_buffer(session, dispatcher, role: str, adapter: Adapter = LOADED) -> dict:
    """The process-wide buffer (built now if the first dispatch has not yet), counted once per process, with the
    bytes NIXL EP's size hint gives for SGLang's arguments (``get_nixl_buffer``'s: the largest elastic width)."""
    import os

    buffer = dispatcher._get_buffer()
    library_buffer = adapter.library_buffer()
    max_ranks = pkgutil.resolve_name(GET_PARALLEL.name)().max_ep_size or dispatcher.group.size()
    buffer_bytes = int(library_buffer.get_rdma_size_hint(dispatcher.num_max_dispatch_tokens_per_rank,
                                                          dispatcher.hidden_size, max_ranks,
                                                          max_ranks * dispatcher.num_local_experts))
    bf16 = os.environ.get(BF16_DISPATCH, "").strip().lower() in ("1", "true", "yes", "on")
    return local_batch.reported(session, role, NIXL, buffer, buffer_bytes,
                                ReportedBuffer(buffer_bytes=buffer_bytes, dispatch_format="bf16" if bf16 else "fp8"))
