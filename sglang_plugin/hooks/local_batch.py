"""Counting a dispatcher whose cap bounds each rank's own batch, the way every such backend shares (DeepEP v2,
pplx, NIXL EP, Mooncake EP, MoRI): its dispatch method (``hidden_states, topk_output``) shadowed on the instance by
one that counts through the one counting primitive (``dispatcher.counting.LayerCounting``); SGLang's class is left
alone.

- the guard: the rank's own batch (``hidden_states.shape[0]``, a host int) against the cap; a batch above it is
  counted, announced and the final report shipped (bounded wait) *before* the call reaches SGLang's own check
  (an assert, a ``ValueError``), which then ends the rank as it would without capwatch (MoRI, which checks
  nothing, has the guard refuse it instead: ``hooks/mori.py``);
- the step on the role's step leader; on the traffic sample (the leader's layer) the (token, expert) pairs this
  rank sends, from the ``topk_ids`` it dispatches: one ``put_`` into the role's per-expert bins
  (``dispatcher.counters.ExpertTraffic``, as DeepEP's hook counts them), after a ``copy_`` into int64 scratch made
  at adoption where the ids are SGLang's int32; no host read. These libraries keep no per-source receive counts
  SGLang hands back, so the received row stays 0 (the group's sent rows say the same traffic);
- the buffer's bytes once per process, at the role's first dispatch (``describe``: the backend's hook asks the
  process-wide buffer, which that dispatch builds anyway, and hands it to ``reported``).

The adoption is here once for every hook that counts this way (Mega MoE's and FlashInfer MegaMoE's too): the
geometry (``Counted``; ``Counted.of`` reads it off an SGLang impl), the layer in its role's expert bins
(``count_layer``), the pairs' scratch (``SentPairs``) and the reports (``reported``); a backend's hook adds only
where its buffer is and what it reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from capwatch.dispatcher.counters import ExpertTraffic
from capwatch.dispatcher.counting import LayerCounting
from capwatch.sglang_engine.caps import reported_backend
from capwatch.sglang_plugin.hooks import adoption
from capwatch.sizing.backends import BackendCapRules

# The construction hook and the targets it relies on, as the backends counted here register them (adoption.py).
COMMON_TARGETS, register = adoption.COMMON_TARGETS, adoption.register


@dataclass(frozen=True)
class SentPairs:
    """Where a dispatch's (token, expert) pairs go: the role's per-expert bins (``ExpertTraffic``: ``sent`` per
    expert; these libraries hand SGLang no per-source receive counts, so ``received`` stays 0), and what adds into
    them without allocating, all made at adoption, before any graph capture."""

    bins: ExpertTraffic  # the layer's way into the counters
    ones: torch.Tensor  # [cap x top_k]: one per pair, the put_'s source
    ids: torch.Tensor  # [cap x top_k] int64: the put_'s index where SGLang's topk_ids are int32 (its top-k kernels')

    @classmethod
    def made(cls, layer: LayerCounting, cap: int, top_k: int) -> "SentPairs":
        """Scratch for ``layer``, whose way into the counters is the role's expert bins (``layer.traffic``)."""
        device = layer.counters.device
        return cls(layer.traffic, torch.ones(cap * top_k, dtype=torch.int64, device=device),
                   torch.empty(cap * top_k, dtype=torch.int64, device=device))

    def count(self, topk_ids: torch.Tensor) -> None:
        """One ``put_`` of the ids into the bins (a -1 expert's pair wraps into the last bin: no rank's); int32 ids
        are first copied into the int64 scratch ``put_`` needs for an index."""
        pairs = topk_ids.numel()
        if topk_ids.dtype != torch.int64:
            topk_ids = self.ids[:pairs].view(topk_ids.shape).copy_(topk_ids)
        self.bins.sent.put_(topk_ids, self.ones[:pairs], accumulate=True)


@dataclass(frozen=True)
class Counted:
    """What a backend's hook adopts: the dispatcher's geometry and how to describe its buffer."""

    cap: int
    ep_rank: int
    ep_size: int
    hidden_size: int
    top_k: int
    num_experts: int

    @classmethod
    def of(cls, impl) -> "Counted":
        """The geometry of an SGLang dispatcher impl that keeps it under SGLang's one set of names (pplx's, Mooncake
        EP's, NIXL EP's, DeepEP v2's): ``num_max_dispatch_tokens_per_rank``, ``group`` (the EP group),
        ``hidden_size``, ``router_topk``, ``num_experts``."""
        group = impl.group
        return cls(cap=impl.num_max_dispatch_tokens_per_rank, ep_rank=group.rank(), ep_size=group.size(),
                   hidden_size=impl.hidden_size, top_k=impl.router_topk, num_experts=impl.num_experts)

    def geometry(self) -> dict:
        return dict(cap=self.cap, ep_rank=self.ep_rank, ep_size=self.ep_size, hidden_size=self.hidden_size,
                    top_k=self.top_k, num_experts=self.num_experts)


def count_layer(session, owner, counted: Counted, rules: BackendCapRules, role: str, layer_id: int | None,
                lead_per_micro_batch: bool) -> LayerCounting:
    """``owner`` as one layer of its role's counters (``adoption.count_layer``), its way into them the role's
    per-expert bins (``counted.num_experts`` of them)."""
    return adoption.count_layer(session, owner, role, layer_id, counted.geometry(), rules,
                                lambda counters: counters.expert_traffic(counted.num_experts), lead_per_micro_batch)


def reported(session, role: str, rules: BackendCapRules, buffer, buffer_bytes: int, described) -> dict:
    """The process-wide ``buffer`` counted once per process (``buffer_bytes``), and what the role's reports carry
    beyond the geometry: the backend (``rules``, bound to SGLang's variable) and ``described``, under its name."""
    session.count_buffer(role, id(buffer), buffer_bytes)
    return dict(backend=reported_backend(rules), a2a_backend=rules.name, **{rules.name: described})


def adopt(session, dispatcher, method: str, counted: Counted, rules: BackendCapRules, role: str,
          layer_id: int | None, describe: Callable[[], dict], lead_per_micro_batch: bool = False,
          overflow: Callable[[LayerCounting, int], None] = adoption.count_overflow) -> LayerCounting:
    """Count ``dispatcher.<method>``: the layer in its role's counters, and at the role's first dispatch its
    reports (``describe()``: what they carry beyond the geometry, the buffer counted). ``overflow(layer, tokens)``
    meets a batch above the cap (counted, then handed to the backend's own check; one that raises refuses it)."""
    layer = count_layer(session, dispatcher, counted, rules, role, layer_id, lead_per_micro_batch)
    sent = SentPairs.made(layer, counted.cap, counted.top_k)
    adoption.count_from_first_dispatch(
        session, dispatcher, layer, method, describe,
        lambda: {method: counted_dispatch(adoption.shipped(dispatcher, method), layer, sent, overflow)})
    return layer


def adopt_low_latency(session, impl, rules: BackendCapRules, role: str, layer_id: int | None,
                      describe: Callable[[], dict]) -> LayerCounting:
    """Count one low-latency dispatcher impl's ``dispatch_a`` (pplx's, Mooncake EP's, NIXL EP's), its geometry
    under SGLang's names (``Counted.of``); SGLang builds one per micro-batch with two-batch overlap, so both
    micro-batches' of the lowest layer lead."""
    return adopt(session, impl, "dispatch_a", Counted.of(impl), rules, role, layer_id, describe,
                 lead_per_micro_batch=True)


def counted_dispatch(dispatch, layer: LayerCounting, sent: SentPairs,
                     overflow: Callable[[LayerCounting, int], None] = adoption.count_overflow):
    """``dispatch(hidden_states, topk_output, ...)`` counted by the layer: the guard (R is the rank's own batch:
    ``rules.local_batch_cap``; ``overflow`` meets a batch above the cap), the call, the step on the leader, the
    pairs sent on the traffic sample."""
    record_step, cap = layer.counters.record_step, layer.cap

    def counted(hidden_states, topk_output, *args, **kwargs):
        local_tokens = hidden_states.shape[0]
        if local_tokens > cap:
            overflow(layer, local_tokens)
            return dispatch(hidden_states, topk_output, *args, **kwargs)  # SGLang's own check ends it
        output = dispatch(hidden_states, topk_output, *args, **kwargs)
        if layer.step_leader:
            record_step(local_tokens, local_tokens)  # no group R: each rank's own batch is what the cap bounds
        if layer.counts_traffic:
            sent.count(topk_output.topk_ids)
        layer.count_dispatch()  # the call: a host int eagerly, nothing captured
        return output

    return counted
