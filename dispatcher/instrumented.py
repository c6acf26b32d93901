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

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.flashinfer_releases import FLASHINFER
from capwatch.sizing.caps import CAP_ALIGNMENT, align_up

from capwatch.vocabulary import OVERFLOW_POLICIES

from .backend import A2ABackend
from .counters import DispatchCounters


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
    rules: BackendCapRules = FLASHINFER  # whose cap: its variable and its largest value

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
ExpertFn = Callable[[list[torch.Tensor]], torch.Tensor]


class InstrumentedDispatcher:
    """Wraps a backend; counts each step's geometry on the device, guards the cap.

    ``step_leader``: of the MoE layers sharing one ``counters``, exactly one (layer 0) records
    the forward step; all of them record their dispatches. The step is recorded before the
    guards, so a step that overflows still lands in the R histogram (bin ``cap + 1``).
    Overflows are counted per step too: a chunked one (and its rounds) only by the step
    leader, though every layer guards and chunks alike; a raised one by the layer that raises,
    which ends the step, so it is counted once whichever layer it is.
    ``on_overflow``: callbacks run with each counted :class:`OverflowEvent` after it is counted
    and before anything is raised; a callback's own exception is attached to the overflow error
    as a note (or warned, when chunking), never raised in its place.
    """

    def __init__(
        self,
        backend: A2ABackend,
        counters: DispatchCounters,
        cap: int,
        overflow_policy: str = "raise",
        step_leader: bool = True,
        on_overflow: Iterable[OverflowCallback] = (),
        rules: BackendCapRules = FLASHINFER,
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
        self.step_leader = step_leader
        self.on_overflow: list[OverflowCallback] = list(on_overflow)
        self.rules = rules

    # --- guards ----------------------------------------------------------------------------

    def _overflow(self, kind: str, outcome: str, runtime_tokens: int, local_tokens: int, rounds: int = 0) -> OverflowEvent:
        needed = max(runtime_tokens, local_tokens)
        event = OverflowEvent(
            kind=kind, outcome=outcome, cap=self.cap, runtime_max_tokens_per_rank=runtime_tokens,
            local_tokens=local_tokens, tokens_needed=needed,
            suggested_cap=suggested_cap(needed, self.rules.alignment),
            role=self.counters.role, ep_rank=self.backend.ep_rank, ep_size=self.backend.ep_size, rules=self.rules,
        )
        failures = []
        # Per step, not per layer: a chunked overflow recurs identically in every MoE layer of the
        # step, so only the step leader counts and announces it (and its rounds). A raise ends the
        # step, so the first layer that raises - leader or not - is the one that counts it.
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

    def _check_local(self, runtime_tokens: int, local_tokens: int) -> None:
        if local_tokens > runtime_tokens:
            self._overflow("local_over_runtime", "raised", runtime_tokens, local_tokens)

    def _record_step(self, runtime_tokens: int, local_tokens: int) -> None:
        if self.step_leader:
            self.counters.record_step(runtime_tokens, local_tokens)

    # --- the plain pair --------------------------------------------------------------------

    def guard(self, runtime_max_tokens_per_rank: int, local_tokens: int) -> None:
        """The cap guards alone, for an engine that computes R itself and asserts on it before it
        dispatches (SGLang): an overflow is counted (the step too), announced, then raised."""
        if local_tokens > runtime_max_tokens_per_rank or runtime_max_tokens_per_rank > self.cap:
            self._record_step(runtime_max_tokens_per_rank, local_tokens)  # an overflowing step still lands in the histogram
            self._check_local(runtime_max_tokens_per_rank, local_tokens)
            self._overflow("runtime_over_cap", "raised", runtime_max_tokens_per_rank, local_tokens)

    def dispatch(
        self,
        token_selected_experts: torch.Tensor,
        payloads: Sequence[torch.Tensor],
        runtime_max_tokens_per_rank: int,
        invalid_token_expert_id: int | None = None,
        expert_id_payload_index: int | None = None,
    ) -> list[torch.Tensor]:
        """Guarded ``backend.dispatch``; ``R > cap`` always raises here (chunking needs :meth:`run`)."""
        runtime_tokens = runtime_max_tokens_per_rank
        if token_selected_experts.shape[0] > runtime_tokens or runtime_tokens > self.cap:
            self.guard(runtime_tokens, token_selected_experts.shape[0])
        backend, counters = self.backend, self.counters
        received = backend.dispatch(
            token_selected_experts, payloads, runtime_tokens, invalid_token_expert_id, expert_id_payload_index
        )
        if self.step_leader:
            counters.record_step(runtime_tokens, token_selected_experts.shape[0])
        counters.record_dispatch(backend.send_counts, backend.recv_counts)
        return received

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

        self._record_step(runtime_tokens, local_tokens)
        self._check_local(runtime_tokens, local_tokens)
        rounds = -(-runtime_tokens // self.cap)
        self._overflow("runtime_over_cap", "chunked", runtime_tokens, local_tokens, rounds=rounds)
        outputs = []
        for round_index in range(rounds):
            start = round_index * self.cap
            round_tokens = min(self.cap, runtime_tokens - start)
            stop = min(start + self.cap, local_tokens)
            start = min(start, local_tokens)  # a rank may run out of tokens before the last round
            received = self.backend.dispatch(
                token_selected_experts[start:stop], [payload[start:stop] for payload in payloads], round_tokens,
                invalid_token_expert_id, expert_id_payload_index,
            )
            self.counters.record_dispatch(self.backend.send_counts, self.backend.recv_counts)
            outputs.append(self.backend.combine(expert_fn(received), round_tokens))
        return torch.cat(outputs, dim=0)
