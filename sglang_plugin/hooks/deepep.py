"""DeepEP's low-latency dispatch in SGLang (``--moe-a2a-backend deepep``): what the plugin hooks, per release.

After SGLang constructs a ``_DeepEPDispatcherImplLowLatency`` (one per layer, one per micro-batch with two-batch
overlap; in auto mode prefill goes to the normal-mode dispatcher, which has no cap) the plugin adopts it: its
``dispatch_a`` (each rank's own batch against the cap, the step on the leader, the pairs sent per rank from
``topk_ids``, on the leader's layer) and ``dispatch_b`` (the pairs received, from DeepEP's handle, on the next
layer in model order: one op per dispatch) are shadowed by instance attributes that
count; SGLang's class is left alone. A batch above the cap is counted and reported before DeepEP's assertion ends
the rank; the buffer's bytes are reported once per process. One adapter serves every verified release (their
shared signatures are checked before anything is hooked). The details: docs/sglang.md ("DeepEP").
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass

import torch
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.dispatcher.counters import ExpertTraffic
from capwatch.dispatcher.counting import LayerCounting
from capwatch.sglang_engine.caps import bind, reported_backend
from capwatch.sglang_plugin.floors import deepep as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.hooks import adoption
from capwatch.sglang_plugin.releases import VERIFIED, Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.deepep_plan import DEEPEP as DEEPEP_RULES

DEEPEP = bind(DEEPEP_RULES)  # with SGLang's variable and default for its cap

NAME = DEEPEP.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.deepep"
LOW_LATENCY = f"{MODULE}._DeepEPDispatcherImplLowLatency"
INIT = Target(f"{LOW_LATENCY}.__init__", ("return_recv_hook",))
DISPATCH_A = Target(f"{LOW_LATENCY}.dispatch_a", ("hidden_states", "topk_output"))
DISPATCH_B = Target(f"{LOW_LATENCY}.dispatch_b", ("hidden_states", "topk_ids", "topk_weights", "masked_m",
                                                   "expected_m", "event", "hook"))
GET_BUFFER = Target(f"{LOW_LATENCY}._get_buffer")
DEEPEP_CONFIG = Target(f"{MODULE}.DeepEPConfig.get_instance")
# DeepEP's own, as SGLang calls it (a DeepEP whose signature moved is refused).
LOW_LATENCY_DISPATCH = Target(f"{MODULE}.Buffer.low_latency_dispatch",
                              ("x", "topk_idx", "num_max_dispatch_tokens_per_rank", "num_experts"))


LOW_LATENCY_ADAPTER = Adapter(releases=VERIFIED, hooked=(INIT, DISPATCH_A, DISPATCH_B, GET_BUFFER, DEEPEP_CONFIG,
                                                         LOW_LATENCY_DISPATCH, *adoption.COMMON_TARGETS))
ADAPTERS = LOW_LATENCY_ADAPTER.by_release()


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why DeepEP's low-latency dispatch cannot be instrumented with ``adapter``, or None: deep_ep imported (SGLang
    defers its import error to the dispatcher's constructor: the backend is unavailable), then every target and
    signature."""
    module = pkgutil.resolve_name(MODULE)
    if not getattr(module, "use_deepep", False):
        return library_missing("DeepEPDispatcher", "deep_ep", getattr(module, "_deepep_import_error", None),
                               "DeepEP (github.com/deepseek-ai/DeepEP)")
    return first_problem(adapter.targets())


# --- the hooks --------------------------------------------------------------------------------------

def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    adoption.register(session, source, INIT, adopt, "DeepEP")


def adopt(session, dispatcher, role: str, layer_id: int | None) -> None:
    """Count one low-latency dispatcher (DeepEP's buffer is SGLang's: nothing allocated but the counters)."""
    group = dispatcher.group
    geometry = dict(cap=dispatcher.num_max_dispatch_tokens_per_rank, ep_rank=group.rank(), ep_size=group.size(),
                    hidden_size=dispatcher.hidden_size, top_k=dispatcher.router_topk,
                    num_experts=dispatcher.num_experts)
    layer = adoption.count_layer(session, dispatcher, role, layer_id, geometry, DEEPEP,
                                 lambda counters: counters.expert_traffic(dispatcher.num_experts),
                                 lead_per_micro_batch=True, split_traffic_halves=True)
    traffic = Traffic.made(dispatcher, layer)
    adoption.count_from_first_dispatch(session, dispatcher, layer, "dispatch_a",
                                       lambda: describe_buffer(session, dispatcher, role),
                                       lambda: counted_dispatches(dispatcher, layer, traffic))


@dataclass(frozen=True)
class Traffic:
    """Where a dispatch's (token, expert) pairs go: the role's per-expert bins (``ExpertTraffic``: sent per expert,
    received per local expert and rank), and what adds into them without allocating, all made at adoption,
    before any graph capture."""

    bins: ExpertTraffic  # the layer's way into the counters
    ones: torch.Tensor  # [cap x top_k]: one per pair, the put_'s source
    received_words: torch.Tensor | None  # [local experts, ranks] int64 scratch where an add_ cannot cast (CPU)

    @classmethod
    def made(cls, dispatcher, layer: LayerCounting) -> "Traffic":
        """Scratch for ``layer``, whose way into the counters is the role's expert bins (``layer.traffic``)."""
        bins, device = layer.traffic, layer.counters.device
        pairs = dispatcher.num_max_dispatch_tokens_per_rank * dispatcher.router_topk
        return cls(bins, torch.ones(pairs, dtype=torch.int64, device=device),
                   None if device.type == "cuda" else torch.empty_like(bins.received))


def count_words(layout_range: torch.Tensor) -> torch.Tensor:
    """The count words of DeepEP's ``packed_recv_layout_range`` (int64 ``count << 32 | begin`` per local expert and
    source rank): an int32 view of their high halves (little-endian, as every GPU host is), nothing copied."""
    return layout_range.view(torch.int32)[:, 1::2]


def unadopt(dispatcher) -> None:
    """SGLang's dispatcher exactly as shipped again (the benchmark's bare side)."""
    adoption.unadopt(dispatcher, "dispatch_a", "dispatch_b")


def describe_buffer(session, dispatcher, role: str) -> dict:
    """The process-wide ``deep_ep.Buffer`` (built now if the first dispatch has not yet), counted once per
    process, and what the reports carry to price it at any other cap."""
    module = pkgutil.resolve_name(MODULE)
    buffer = dispatcher._get_buffer()
    mode = dispatcher.deepep_mode.value
    normal_nvl = normal_rdma = 0
    if mode == "auto":  # normal mode's hints, as get_deepep_buffer takes them (--deepep-config or DeepEP's table)
        ranks, hidden_bytes = buffer.group_size, dispatcher.hidden_size * dispatcher.params_bytes
        configs = module.DeepEPConfig.get_instance()
        for config in (configs.normal_dispatch_config or module.Buffer.get_dispatch_config(ranks),
                       configs.normal_combine_config or module.Buffer.get_combine_config(ranks)):
            normal_nvl = max(normal_nvl, config.get_nvl_buffer_size_hint(hidden_bytes, ranks))
            normal_rdma = max(normal_rdma, config.get_rdma_buffer_size_hint(hidden_bytes, ranks))
    session.count_buffer(role, id(buffer), int(buffer.num_nvl_bytes) + int(buffer.num_rdma_bytes))
    return dict(backend=reported_backend(DEEPEP), a2a_backend=DEEPEP.name,
                deepep=DeepEPBuffer(mode=mode, buffer_experts=dispatcher.num_experts, normal_nvl_bytes=normal_nvl,
                                    normal_rdma_bytes=normal_rdma))


def counted_dispatches(dispatcher, layer: LayerCounting, traffic: Traffic) -> dict:
    """The dispatcher's ``dispatch_a`` and ``dispatch_b`` counted (built at the role's first dispatch: the buffer
    exists then, and the layer's lead and sample are elected). The role splits the traffic's halves
    (``dispatcher.counting.elect``): the leader's layer counts what it sends, the next place what it receives, so
    a dispatch launches at most one op eagerly; a role of one MoE layer counts both on it."""
    return dict(dispatch_a=counted_dispatch_a(adoption.shipped(dispatcher, "dispatch_a"), dispatcher, layer, traffic),
                dispatch_b=counted_dispatch_b(adoption.shipped(dispatcher, "dispatch_b"), dispatcher, layer, traffic))


def counted_dispatch_a(dispatch_a, dispatcher, layer: LayerCounting, traffic: Traffic):
    """``_DeepEPDispatcherImplLowLatency.dispatch_a`` as SGLang calls it, counted by the layer's ``LayerCounting``:
    the guard (R is the rank's own batch: ``rules.local_batch_cap``), the step on the leader, what it sends (the
    traffic sample's sent half, read once here: the leader's layer)."""
    record_step, cap = layer.counters.record_step, layer.cap
    sent, ones = traffic.bins.sent, traffic.ones

    def guarded(hidden_states, topk_output):
        local_tokens = hidden_states.shape[0]
        if local_tokens > cap:
            adoption.count_overflow(layer, local_tokens)
            return None, dispatch_a(hidden_states=hidden_states, topk_output=topk_output)  # DeepEP's assertion
        return local_tokens, dispatch_a(hidden_states=hidden_states, topk_output=topk_output)

    if not layer.counts_traffic:  # outside the sample of what is sent: dispatch_b counts the call
        def counted(hidden_states, topk_output):
            local_tokens, state = guarded(hidden_states, topk_output)
            if local_tokens is not None and layer.step_leader:
                record_step(local_tokens, local_tokens)
            return state
        return counted

    def counted_sampled(hidden_states, topk_output):
        local_tokens, state = guarded(hidden_states, topk_output)
        if local_tokens is None:
            return state
        if layer.step_leader:
            record_step(local_tokens, local_tokens)  # no group R: each rank's own batch is what DeepEP checks
        pairs = state[1]  # topk_ids, int64; -1: no expert (DeepEP sends nothing for it; its own bin)
        sent.put_(pairs, ones[: pairs.numel()], accumulate=True)
        return state

    return counted_sampled


def counted_dispatch_b(dispatch_b, dispatcher, layer: LayerCounting, traffic: Traffic):
    """``dispatch_b`` counted: the call, and on the layer counting the received half (``counts_received``: the
    place after the leader's), after DeepEP's receive, the pairs each local expert got from each rank (its layout
    range's count words) into the role's bins."""
    record_call, received, scratch = layer.counters.record_call, traffic.bins.received, traffic.received_words

    if not layer.counts_received:
        def counted(*state):
            output = dispatch_b(*state)
            record_call()  # a host int eagerly, nothing captured
            return output
        return counted

    def counted_sampled(*state):
        output = dispatch_b(*state)
        record_call()
        words = count_words(dispatcher.handle[1])
        if scratch is None:
            received.add_(words)  # CUDA: one kernel, cast as it reads
        else:
            received.add_(scratch.copy_(words))
        return output

    return counted_sampled
