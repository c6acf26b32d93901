"""NIXL EP in SGLang (``--moe-a2a-backend nixl``): what the plugin hooks, on 0.5.23.

SGLang builds one ``_NixlEPDispatcherImpl`` per ``NixlEPDispatcher`` (low-latency mode only; one per micro-batch
with two-batch overlap) and drives it like DeepEP's: ``dispatch_a(hidden_states, topk_output)``, whose NIXL EP
dispatch asserts each rank's own batch fits the cap (SGLang checks nothing). After SGLang constructs one (a
``HookRegistry`` hook on ``__init__``; the layer id from ``create_moe_dispatcher``) the plugin counts its
``dispatch_a`` (``hooks/local_batch.py``): an overflow is counted and reported before NIXL EP's assertion. The
process-wide buffer (``NixlEPBuffer.get_nixl_buffer``, built at the first dispatch) gets NIXL EP's own
``Buffer.get_rdma_size_hint(T, hidden, max_ranks, max_ranks x local experts)`` bytes: the plugin asks it in the
rank with SGLang's arguments and reports that (``backends/reported.py``).
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass

from capwatch.backends.reported import ReportedBuffer
from capwatch.sglang_engine.caps import bind, reported_backend
from capwatch.sglang_plugin.hooks import local_batch
from capwatch.sglang_plugin.floors import nixl as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.releases import Target, first_problem
from capwatch.sizing.nixl import NIXL as NIXL_RULES

NIXL = bind(NIXL_RULES)  # with SGLang's variable and default for its cap

NAME = NIXL.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.nixl"
IMPL = f"{MODULE}._NixlEPDispatcherImpl"
INIT = Target(f"{IMPL}.__init__", ("return_recv_hook",))
DISPATCH_A = Target(f"{IMPL}.dispatch_a", ("hidden_states", "topk_output"))
GET_BUFFER = Target(f"{IMPL}._get_buffer")
LOAD = Target(f"{MODULE}._load_nixl_ep")
GET_PARALLEL = Target(f"{MODULE}.get_parallel")
BF16_DISPATCH = "SGLANG_NIXL_EP_BF16_DISPATCH"


@dataclass(frozen=True)
class Adapter:
    releases: tuple[str, ...]

    def targets(self) -> tuple[Target, ...]:
        return (INIT, DISPATCH_A, GET_BUFFER, LOAD, GET_PARALLEL, *local_batch.COMMON_TARGETS)


ADAPTER = Adapter(releases=("0.5.23",))  # verified on 0.5.23 (tests/sglang/test_nixl_plugin.py)
ADAPTERS = {release: ADAPTER for release in ADAPTER.releases}


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | None:
    """Why NIXL EP cannot be instrumented, or None: nixl_ep imports (SGLang imports it at the first dispatcher),
    then every target and signature."""
    found = first_problem(adapter.targets())
    if found is not None:
        return found
    try:
        buffer, _ = pkgutil.resolve_name(LOAD.name)()
    except Exception as error:
        return f"nixl_ep does not import ({type(error).__name__}: {error}): NIXL EP is not installed"
    if not callable(getattr(buffer, "get_rdma_size_hint", None)):
        return "nixl_ep.Buffer has no get_rdma_size_hint: a NIXL EP capwatch does not know"
    return None


def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    local_batch.register(session, source, INIT, adopt, "NIXL EP")


def adopt(session, dispatcher, role: str, layer_id: int | None) -> None:
    """Count one low-latency dispatcher's ``dispatch_a``; both micro-batches' of the lowest layer lead."""
    group = dispatcher.group
    counted = local_batch.Counted(cap=dispatcher.num_max_dispatch_tokens_per_rank, ep_rank=group.rank(),
                                  ep_size=group.size(), hidden_size=dispatcher.hidden_size,
                                  top_k=dispatcher.router_topk, num_experts=dispatcher.num_experts)
    local_batch.adopt(session, dispatcher, "dispatch_a", counted, NIXL, role, layer_id,
                      describe=lambda: describe_buffer(session, dispatcher, role), lead_per_micro_batch=True)


def describe_buffer(session, dispatcher, role: str) -> dict:
    """The process-wide buffer (built now if the first dispatch has not yet), counted once per process, with the
    bytes NIXL EP's size hint gives for SGLang's arguments (``get_nixl_buffer``'s: the largest elastic width)."""
    import os

    buffer = dispatcher._get_buffer()
    library_buffer, _ = pkgutil.resolve_name(LOAD.name)()
    max_ranks = pkgutil.resolve_name(GET_PARALLEL.name)().max_ep_size or dispatcher.group.size()
    buffer_bytes = int(library_buffer.get_rdma_size_hint(dispatcher.num_max_dispatch_tokens_per_rank,
                                                          dispatcher.hidden_size, max_ranks,
                                                          max_ranks * dispatcher.num_local_experts))
    session.count_buffer(role, id(buffer), buffer_bytes)
    bf16 = os.environ.get(BF16_DISPATCH, "").strip().lower() in ("1", "true", "yes", "on")
    return dict(backend=reported_backend(NIXL), a2a_backend=NAME,
                **{NAME: ReportedBuffer(buffer_bytes=buffer_bytes, dispatch_format="bf16" if bf16 else "fp8")})
