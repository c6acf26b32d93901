"""One MoE layer's counting, the one primitive every dispatcher and engine hook builds on: the guard past the cap
(host ints, before the transport), the transport, the step on the role's step leader, the traffic.

:class:`LayerCounting` is what ``InstrumentedDispatcher`` and each engine hook (``sglang_plugin/hooks``) keep per
counted object. Its way into the counters is chosen at construction:

- :class:`CounterWords`: the transport leaves the dispatch's counts in place, a ``[2, ep_size]`` view (the sent
  row, the received row) valid until the next dispatch: FlashInfer's int32 workspace words, a backend's own
  int64 counts (:meth:`DispatchCounters.record_counter_words`);
- a :class:`~capwatch.dispatcher.counters.TrafficRecord`: the caller writes ``record.counts`` itself (a backend with
  no such view) and the counters add it (:meth:`DispatchCounters.record_traffic`);
- the counters' :class:`~capwatch.dispatcher.counters.ExpertTraffic`: the caller adds its per-expert counts into
  the counters' expert bins itself, one op each (DeepEP's ``topk_ids`` and layout range), and the layer counts
  the call (a host int eagerly).

Which R: the value the backend bounds by its cap. FlashInfer (and any backend with a group-wide R) bounds SGLang's
``runtime_max_tokens_per_rank``, the largest local batch of the step over the group; a backend whose rules say
``local_batch_cap`` (DeepEP) bounds each rank's own batch, so there its R *is* the local batch
(``LayerCounting.counted``; DeepEP's hook passes its batch as R). The local batch is always this rank's own token count (a tensor shape).
Overflows, their counting and their messages live here too (docs/dispatcher.md, "One counting primitive").

What each layer counts (:func:`elect`; docs/dispatcher.md, "Counting a GPU does not notice"): within one forward
step every MoE layer dispatches the same tokens, so R, the local batch and an overflow are the same on every
layer; only the routing differs. The step leader counts the step; every layer guards (host ints) and counts its
call (a host int eagerly, none captured); only the layers of the traffic sample add their per-rank counts (one
``add_``): ``TRAFFIC_SAMPLE_STRIDE`` apart, from the leader's layer on. A hook whose two halves are two ops in two
calls (DeepEP: what it sends in ``dispatch_a``, what it receives in ``dispatch_b``) asks :func:`elect` to split
them (``split_halves``): each sampled layer counts what it sends, the next place in model order what it receives,
so no dispatch launches more than one op eagerly.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from capwatch.backends import DEFAULT_BACKEND
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.caps import CAP_ALIGNMENT, align_up

from .counters import DispatchCounters, ExpertTraffic, TrafficRecord


def suggested_cap(tokens_needed: int, alignment: int = CAP_ALIGNMENT) -> int:
    """Smallest multiple of ``alignment`` (128) that holds ``tokens_needed`` tokens per rank."""
    return max(alignment, align_up(tokens_needed, alignment))


@dataclass(frozen=True)
class OverflowEvent:
    kind: str  # "runtime_over_cap" | "local_over_runtime"
    outcome: str  # "raised" | "chunked"
    cap: int
    runtime_max_tokens_per_rank: int
    local_tokens: int
    tokens_needed: int
    suggested_cap: int
    role: str
    ep_rank: int
    ep_size: int
    rules: BackendCapRules = DEFAULT_BACKEND.rules  # whose cap: its variable and its largest value

    @property
    def message(self) -> str:
        where = f"[{self.role} dispatcher, EP rank {self.ep_rank}/{self.ep_size}]"
        set_cap = self.rules.env_line(self.suggested_cap)
        if self.rules.local_batch_cap:  # the backend checks each rank's own batch: no group-wide R
            most = self.rules.max_cap_tokens
            fix = (f"Set {set_cap} (or more)" if self.tokens_needed <= most else
                   f"{self.tokens_needed} is above the {most} {self.rules.name} accepts: lower the batch "
                   "(--cuda-graph-max-bs, --max-running-requests, --chunked-prefill-size)")
            return (f"{self.rules.name} dispatch has {self.local_tokens} tokens on this rank but the per-rank cap "
                    f"is {self.cap}: {self.rules.overflow_outcome}. {fix}. {where}")
        if self.kind == "runtime_over_cap":
            return (
                f"MoE A2A dispatch needs {self.tokens_needed} tokens per rank (runtime_max_tokens_per_rank) "
                f"but the per-rank cap is {self.cap}. Set {set_cap} (or more) to hold {self.tokens_needed} "
                f"tokens, or let InstrumentedDispatcher.run() chunk the step (overflow_policy='chunk'). {where}"
            )
        return (
            f"MoE A2A dispatch has {self.local_tokens} local tokens but runtime_max_tokens_per_rank is "
            f"{self.runtime_max_tokens_per_rank} (cap {self.cap}): they would overwrite other ranks' slots. "
            f"Pass R >= {self.tokens_needed}, the largest local batch over all ranks; {self.tokens_needed} "
            f"tokens per rank need {set_cap} (or more) if the cap is smaller. {where}"
        )


class CapOverflowError(RuntimeError):
    def __init__(self, event: OverflowEvent):
        super().__init__(event.message)
        self.event = event


OverflowCallback = Callable[[OverflowEvent], None]

# The traffic sample: the step leader's layer and every this-many-th layer after it (FlashInfer: 4 of DeepSeek-V3's
# 58 MoE layers). None: the leader's layer alone (DeepEP and the local-batch backends).
TRAFFIC_SAMPLE_STRIDE = 16


class CounterWords:
    """The way into the counters of a transport that leaves its counts in place: ``words``, a ``[2, ep_size]``
    view (sent row, received row; int32 or int64) valid from the end of a dispatch until the next."""

    def __init__(self, words: torch.Tensor):
        if words.dim() != 2 or words.shape[0] != 2:
            raise ValueError(f"counter words must be a [2, ep_size] view (sent, received), got {tuple(words.shape)}")
        self.words = words


TrafficWay = CounterWords | TrafficRecord | ExpertTraffic


class LayerCounting:
    """One counted MoE layer (one counted object: a FlashInfer ``MoeAlltoAll``, a DeepEP dispatcher, a backend) in
    its role's shared ``counters``.

    ``step_leader``: of the layers sharing ``counters``, exactly one (the lowest layer; with DeepEP's two-batch
    overlap both micro-batches' of it) records the forward step; every layer records its dispatch call, and those
    of the traffic sample (``counts_traffic``, see :func:`elect`) its per-rank counts. A step that
    overflows is recorded before the guard raises, so it lands in the R histogram (bin ``cap + 1``). Overflows are
    counted per step: a chunked one (and its rounds) only by the step leader, though every layer guards and chunks
    alike; a raised one by the layer that raises, which ends the step. ``on_overflow``: callbacks run with each
    counted :class:`OverflowEvent` after it is counted and before anything is raised; a callback's own exception
    is attached to the overflow error as a note (or warned, when chunking), never raised in its place.
    """

    def __init__(self, counters: DispatchCounters, ep_rank: int, ep_size: int, traffic: TrafficWay,
                 rules: BackendCapRules = DEFAULT_BACKEND.rules, step_leader: bool = True,
                 on_overflow: Iterable[OverflowCallback] = (), counts_traffic: bool = True):
        if counters.ep_size != ep_size:
            raise ValueError(f"counters are for ep_size {counters.ep_size}, this layer's group has {ep_size}")
        if not isinstance(traffic, (CounterWords, TrafficRecord, ExpertTraffic)):
            raise TypeError(f"traffic must be CounterWords, a TrafficRecord or ExpertTraffic, got "
                            f"{type(traffic).__name__}")
        self.counters = counters
        self.cap = counters.cap
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.rules = rules
        self.step_leader = step_leader
        self.on_overflow: list[OverflowCallback] = list(on_overflow)
        self.traffic = traffic
        if isinstance(traffic, CounterWords):  # copied into this record where an add_ of the words cannot take them
            self.record_traffic: Callable[[], None] = functools.partial(
                counters.record_counter_words, counters.traffic_record(), traffic.words)
        elif isinstance(traffic, ExpertTraffic):  # the caller adds the counts; the call is a host int
            self.record_traffic = counters.record_call
        else:
            self.record_traffic = functools.partial(counters.record_traffic, traffic)
        self.counts_traffic = counts_traffic
        self._counts_received: bool | None = None  # None: as counts_traffic (the halves not split)

    @property
    def counts_traffic(self) -> bool:
        """Whether this layer is in the traffic sample: its dispatch adds its per-rank counts (one op), or only its
        call (a host int eagerly, nothing captured); where its role splits the halves (:func:`elect`), what it
        sends only. A hook reads it once, when it builds its counted calls (after the election), not per call."""
        return self._counts_traffic

    @property
    def counts_received(self) -> bool:
        """Whether this layer counts what it receives, for a hook that counts the two halves in two ops (DeepEP's
        ``dispatch_b``): ``counts_traffic`` unless the role splits the halves (:func:`elect`), then the place
        after a sampled one. Read once, like ``counts_traffic``."""
        return self._counts_traffic if self._counts_received is None else self._counts_received

    @counts_received.setter
    def counts_received(self, sampled: bool | None) -> None:
        self._counts_received = None if sampled is None else bool(sampled)

    @counts_traffic.setter
    def counts_traffic(self, sampled: bool) -> None:
        self._counts_traffic = bool(sampled)
        self.count_dispatch: Callable[[], None] = self.record_traffic if sampled else self.counters.record_call

    # --- the guard past the cap --------------------------------------------------------------------

    def guard(self, runtime_tokens: int, local_tokens: int) -> None:
        """Where R or the local batch is past what the cap allows: the step recorded (on the leader), the overflow
        counted, announced, then raised (:class:`CapOverflowError`). Nothing where they fit."""
        if local_tokens > runtime_tokens or runtime_tokens > self.cap:
            self.record_step(runtime_tokens, local_tokens)  # an overflowing step still lands in the histogram
            if local_tokens > runtime_tokens:
                self.overflow("local_over_runtime", "raised", runtime_tokens, local_tokens)
            self.overflow("runtime_over_cap", "raised", runtime_tokens, local_tokens)

    def overflow(self, kind: str, outcome: str, runtime_tokens: int, local_tokens: int,
                 rounds: int = 0) -> OverflowEvent:
        """Count and announce one overflow; a raised one is then raised."""
        needed = max(runtime_tokens, local_tokens)
        event = OverflowEvent(
            kind=kind, outcome=outcome, cap=self.cap, runtime_max_tokens_per_rank=runtime_tokens,
            local_tokens=local_tokens, tokens_needed=needed, suggested_cap=suggested_cap(needed, self.rules.alignment),
            role=self.counters.role, ep_rank=self.ep_rank, ep_size=self.ep_size, rules=self.rules,
        )
        failures = []
        # Per step, not per layer: a chunked overflow recurs identically in every MoE layer of the step, so only
        # the step leader counts and announces it (and its rounds). A raise ends the step, so the first layer
        # that raises - leader or not - is the one that counts it.
        if outcome == "raised" or self.step_leader:
            self.counters.record_overflow(kind, outcome, chunked_rounds=rounds)  # counted before anything else
            for callback in self.on_overflow:
                try:
                    callback(event)
                except Exception as error:  # a broken hook must not hide the overflow itself
                    failures.append(f"on_overflow callback {callback!r} failed: {error!r}")
        if outcome == "raised":
            error = CapOverflowError(event)
            for failure in failures:
                error.add_note(failure)
            raise error
        for failure in failures:
            warnings.warn(failure, RuntimeWarning, stacklevel=3)
        return event

    # --- after the transport -----------------------------------------------------------------------

    def record_step(self, runtime_tokens: int, local_tokens: int) -> None:
        if self.step_leader:
            self.counters.record_step(runtime_tokens, local_tokens)

    def counted(self, transport: Callable) -> Callable:
        """``transport`` (FlashInfer's ``MoeAlltoAll.dispatch`` signature: the tokens' experts first, R third)
        counted: the hot path. The guard on host ints, the transport, the step on the leader, the call and (in the
        traffic sample) the traffic; nothing else. Its ``counting`` and ``transport`` name what it counts into and
        what it wraps (a benchmark rebuilds it around another transport; not ``__wrapped__``: inspect would take
        the transport's signature)."""
        counting, cap = self, self.cap
        record_step = self.counters.record_step
        local_cap = self.rules.local_batch_cap

        def counted(token_selected_experts, input_payloads, runtime_max_tokens_per_rank, invalid_token_expert_id=None,
                    expert_id_payload_index=None, **more):
            local_tokens = token_selected_experts.shape[0]
            runtime_tokens = local_tokens if local_cap else runtime_max_tokens_per_rank
            if runtime_tokens > cap or local_tokens > runtime_tokens:
                counting.guard(runtime_tokens, local_tokens)  # counts, reports, raises CapOverflowError
            received = transport(token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                                 invalid_token_expert_id, expert_id_payload_index, **more)
            if counting.step_leader:
                record_step(runtime_tokens, local_tokens)
            counting.count_dispatch()  # the call, and the traffic where this layer is sampled
            return received

        counted.counting, counted.transport = self, transport
        return counted


def elect(counters: DispatchCounters, layers: Sequence[LayerCounting], positions: Sequence[int],
          traffic_stride: int | None = TRAFFIC_SAMPLE_STRIDE, split_halves: bool = False) -> None:
    """Who counts what, among the layers sharing ``counters``: ``positions[i]`` is layer i's place among the role's
    layers in model order (0: the lowest; a micro-batch's twin dispatcher of one layer shares its place). Place 0
    leads the step; places ``0, stride, 2 x stride, ...`` are the traffic sample (``None``: place 0 alone); the
    counters' ``layers_per_step`` (the calls a captured step stands for) is the number of places.

    ``split_halves`` (a hook whose sent and received halves are two ops in two calls: DeepEP's): a sampled place
    counts what it sends, and the next place in model order what it receives (``counts_received``), so each
    dispatch launches at most one op eagerly; as many places count each half. A sampled place with no next place,
    or whose next place is sampled too (stride 1), keeps both halves (a role with a single MoE place: its layer)."""
    if len(layers) != len(positions):
        raise ValueError(f"{len(layers)} layers but {len(positions)} positions")
    if traffic_stride is not None and traffic_stride < 1:
        raise ValueError(f"traffic_stride must be a positive number of layers or None, got {traffic_stride!r}")

    def sampled(position: int) -> bool:
        return position == 0 if traffic_stride is None else position % traffic_stride == 0

    places = set(positions)
    receiving = {position + 1 if position + 1 in places and not sampled(position + 1) else position
                 for position in places if sampled(position)} if split_halves else None
    for layer, position in zip(layers, positions):
        layer.step_leader = position == 0
        layer.counts_traffic = sampled(position)
        layer.counts_received = None if receiving is None else position in receiving
    counters.layers_per_step = len(places) or 1
