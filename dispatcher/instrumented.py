"""``InstrumentedDispatcher``: any A2A backend, with loud cap guards and device-side counters.

Guards run before every dispatch with plain ``if``/``raise`` (no ``assert``, so ``python -O``
keeps them) on host-side integers only: ``R`` is a Python int and the local token count is a
tensor *shape*, so a guard never syncs the device.

* ``R > cap``: FlashInfer would only trip a Python assert (or write past the workspace).
* ``local tokens > R``: FlashInfer up to 0.7.2.post1 never checks this; the kernel writes
  into other ranks' slots.

Every overflow is counted in the device counters and announced to the ``on_overflow``
callbacks *before* anything is raised, so a reporter can ship a last report.

Overflow policy ``"chunk"``: ``R`` is the group-wide maximum and every rank passes the same
value (as SGLang does), so every rank derives the same ``rounds = ceil(R / cap)`` and runs the
same number of collectives; round i dispatches local tokens ``[i*cap, (i+1)*cap)`` with
``R_i = min(cap, R - i*cap)``. Because FlashInfer's workspace holds one round at a time, chunking
needs the expert computation between dispatch and combine: use :meth:`InstrumentedDispatcher.run`.
A ``local > R`` overflow is always raised: the other ranks cannot know about it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from capwatch.backends import DEFAULT_BACKEND
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.caps import CAP_ALIGNMENT, align_up

from capwatch.vocabulary import OVERFLOW_POLICIES

from .backend import A2ABackend
from .counters import DispatchCounters
# The overflow's event, error and suggested cap live with the counting primitive; importable from here as before.
from .counting import CapOverflowError, CounterWords, LayerCounting, OverflowCallback, OverflowEvent, suggested_cap

__all__ = ["CapOverflowError", "InstrumentedDispatcher", "OverflowCallback", "OverflowEvent", "suggested_cap"]

ExpertFn = Callable[[list[torch.Tensor]], torch.Tensor]


class InstrumentedDispatcher:
    """Wraps a backend; guards the cap and counts each dispatch through one :class:`LayerCounting` (``counting``:
    the step on the leader, the overflows, the traffic), as every engine hook does.

    ``step_leader``: of the MoE layers sharing one ``counters``, exactly one (layer 0) records the forward step;
    all of them record their dispatches (see :class:`LayerCounting` for the overflows and ``on_overflow``). The
    traffic goes in as the backend's ``traffic_counts()`` view where it has one (one op), else through a record
    the dispatcher copies ``send_counts`` and ``recv_counts`` into.
    """

    def __init__(
        self,
        backend: A2ABackend,
        counters: DispatchCounters,
        cap: int,
        overflow_policy: str = "raise",
        step_leader: bool = True,
        on_overflow: Iterable[OverflowCallback] = (),
        rules: BackendCapRules = DEFAULT_BACKEND.rules,
    ):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise ValueError(f"cap must be a positive int (tokens per rank), got {cap!r}")
        if overflow_policy not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow_policy must be one of {OVERFLOW_POLICIES}, got {overflow_policy!r}")
        if counters.ep_size != backend.ep_size:
            raise ValueError(f"counters are for ep_size {counters.ep_size}, the backend has {backend.ep_size}")
        if counters.cap != cap:
            raise ValueError(f"counters were sized for cap {counters.cap}, the dispatcher's cap is {cap}")
        self.backend = backend
        self.counters = counters
        self.cap = cap
        self.overflow_policy = overflow_policy
        traffic_counts = getattr(backend, "traffic_counts", lambda: None)()
        self._record = None if traffic_counts is not None else counters.traffic_record()  # fed per dispatch
        self.counting = LayerCounting(counters, backend.ep_rank, backend.ep_size,
                                      CounterWords(traffic_counts) if traffic_counts is not None else self._record,
                                      rules=rules, step_leader=step_leader, on_overflow=on_overflow)
        self._dispatch = self.counting.counted(self._transport)
        # One more MoE layer of the role on these counters: a captured step stands for one call of each (a captured
        # layer launches nothing for its call). The SGLang session sets it by its election instead (counting.elect).
        counters.instrumented_layers += 1
        counters.layers_per_step = counters.instrumented_layers

    @property
    def step_leader(self) -> bool:
        return self.counting.step_leader

    @step_leader.setter
    def step_leader(self, leader: bool) -> None:
        self.counting.step_leader = leader

    @property
    def on_overflow(self) -> list[OverflowCallback]:
        return self.counting.on_overflow

    @property
    def rules(self) -> BackendCapRules:
        return self.counting.rules

    def _transport(self, token_selected_experts, payloads, runtime_max_tokens_per_rank, invalid_token_expert_id=None,
                   expert_id_payload_index=None):
        received = self.backend.dispatch(token_selected_experts, payloads, runtime_max_tokens_per_rank,
                                         invalid_token_expert_id, expert_id_payload_index)
        self._feed_record()
        return received

    def _feed_record(self) -> None:
        """A backend without one ``[2, ep_size]`` view: its counts copied into the record the counting adds."""
        if self._record is not None:
            self._record.counts[0].copy_(self.backend.send_counts)
            self._record.counts[1].copy_(self.backend.recv_counts)

    # --- the plain pair --------------------------------------------------------------------

    def guard(self, runtime_max_tokens_per_rank: int, local_tokens: int) -> None:
        """The cap guards alone, for an engine that computes R itself and asserts on it before it
        dispatches (SGLang): an overflow is counted (the step too), announced, then raised."""
        self.counting.guard(runtime_max_tokens_per_rank, local_tokens)

    def dispatch(
        self,
        token_selected_experts: torch.Tensor,
        payloads: Sequence[torch.Tensor],
        runtime_max_tokens_per_rank: int,
        invalid_token_expert_id: int | None = None,
        expert_id_payload_index: int | None = None,
    ) -> list[torch.Tensor]:
        """Guarded ``backend.dispatch``; ``R > cap`` always raises here (chunking needs :meth:`run`)."""
        return self._dispatch(token_selected_experts, payloads, runtime_max_tokens_per_rank,
                              invalid_token_expert_id, expert_id_payload_index)

    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int, **options) -> torch.Tensor:
        """``backend.combine``; ``options`` are the backend's own (FlashInfer's ``payload_in_workspace``)."""
        if options:
            return self.backend.combine(payload, runtime_max_tokens_per_rank, **options)
        return self.backend.combine(payload, runtime_max_tokens_per_rank)

    # --- one whole MoE communication step, chunked if the policy says so ----------------------

    def run(
        self,
        token_selected_experts: torch.Tensor,
        payloads: Sequence[torch.Tensor],
        runtime_max_tokens_per_rank: int,
        expert_fn: ExpertFn,
        invalid_token_expert_id: int | None = None,
        expert_id_payload_index: int | None = None,
    ) -> torch.Tensor:
        """dispatch -> ``expert_fn(received) -> [ep_size, R_i, H]`` -> combine, returning ``[T, H]``."""
        runtime_tokens, local_tokens = runtime_max_tokens_per_rank, token_selected_experts.shape[0]
        if runtime_tokens <= self.cap or self.overflow_policy == "raise":
            received = self.dispatch(token_selected_experts, payloads, runtime_tokens,
                                     invalid_token_expert_id, expert_id_payload_index)
            return self.combine(expert_fn(received), runtime_tokens)

        counting = self.counting
        counting.record_step(runtime_tokens, local_tokens)
        if local_tokens > runtime_tokens:
            counting.overflow("local_over_runtime", "raised", runtime_tokens, local_tokens)
        rounds = -(-runtime_tokens // self.cap)
        counting.overflow("runtime_over_cap", "chunked", runtime_tokens, local_tokens, rounds=rounds)
        outputs = []
        for round_index in range(rounds):
            start = round_index * self.cap
            round_tokens = min(self.cap, runtime_tokens - start)
            stop = min(start + self.cap, local_tokens)
            start = min(start, local_tokens)  # a rank may run out of tokens before the last round
            received = self._transport(
                token_selected_experts[start:stop], [payload[start:stop] for payload in payloads], round_tokens,
                invalid_token_expert_id, expert_id_payload_index,
            )
            counting.count_dispatch()  # each round is a call (and its traffic, where this layer is sampled)
            outputs.append(self.backend.combine(expert_fn(received), round_tokens))
        return torch.cat(outputs, dim=0)
