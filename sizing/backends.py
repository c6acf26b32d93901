"""The rules of an A2A backend's per-rank cap: the variable the engine reads it from, the alignment and range
capwatch advises within, and what happens below its floor.

Each backend's own rules live in its sizing module (``FLASHINFER`` in ``flashinfer_releases``, ``DEEPEP`` in
``deepep_plan``) and reach every other part through its spec (``capwatch.backends``, the one registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from capwatch.sizing.caps import CAP_ALIGNMENT, MAX_CAP_TOKENS
from capwatch.sizing.checks import SizingError


@dataclass(frozen=True)
class BackendCapRules:
    name: str  # as SGLang's --moe-a2a-backend spells it
    # Where the engine reads the per-rank cap from, its default when unset (None: a rule, not a number) and what
    # it sets aside for the backend's buffers whatever the cap (None: nothing of its own). The engine's facts,
    # not the backend's: its home fills them in (sglang_engine/caps.py, through capwatch.engines) and the
    # registry's specs (capwatch.backends) carry them; a backend's sizing module leaves them unset.
    cap_env_var: str = ""
    alignment: int = CAP_ALIGNMENT  # caps capwatch suggests are multiples of this
    max_cap_tokens: int = MAX_CAP_TOKENS  # the largest cap the backend accepts
    # Caps must be multiples of this or the backend misbehaves (1: any cap works); the advice's alignment
    # is a multiple of it whatever the advisor's policy says.
    required_alignment: int = 1
    why_aligned: str = ""  # what a cap off that alignment breaks
    why_max: str = ""  # who refuses a cap above max_cap_tokens
    default_cap: int | None = None
    # What happens below SGLang's floor terms (None: SGLang's own start-up check where the release has one,
    # sglang_engine/floor.py sglang_floor_why).
    below_floor: str | None = None
    # Whether eager prefill batches go through this backend's dispatch on every release (FlashInfer's go through
    # an all-gather on the releases without SGLang's own floor rule, so the prefill chunk is no term there).
    eager_prefill_dispatched: bool = False
    # The backend checks each rank's own batch against the cap (DeepEP), not a group-wide R (FlashInfer's
    # runtime_max_tokens_per_rank): R is the local batch, and an overflow message says so.
    local_batch_cap: bool = False
    overflow_outcome: str = "the dispatch is refused"  # what a batch above the cap does, in words
    # What an eager step above the cap does instead of failing, in words (None: it fails): a slower path (DeepGEMM
    # Mega MoE's fallback). Raising the cap then buys speed with memory, no rank is at risk; advice and findings say so.
    over_cap_fallback: str | None = None
    memory: str = "workspace"  # what the cap sizes, in the advice's words
    sized_by: str = "its formula"  # what capwatch prices it with, in the findings' words
    mismatch_hint: str = "check the payload sizes"  # where a reported size that differs comes from
    # A known bug sized this backend's memory for cap x ep_size tokens per rank (sglang PR #25907, FlashInfer's
    # max_num_tokens): the service's findings name it when a rank's reported size matches that.
    sized_for_group_bug: bool = False
    engine_reserve_bytes: int | None = None
    # The engine's setting that picks the backend's kernel mode, as its settings name it (None: none); bound by
    # the engine's home like the variable.
    mode_setting: str | None = None
    # The engine's own code for the backend (how it allocates the backend's memory, what it asserts of the cap,
    # ``capwatch plan``'s engine modes): its module's import name, bound by the engine's home
    # (sglang_engine/caps.py); None: nothing beyond the facts above. A name, not the module, so the rules stay
    # plain data (copied, pickled, ``dataclasses.asdict`` of an ``OverflowEvent``). What a spec calls on it is a
    # Protocol in the spec's module, read through ``capwatch.backends.spec.engine_side`` (e.g. backends/deepep.py
    # ``DeepEPEngineSide``).
    engine_side: str | None = field(default=None, compare=False, repr=False)

    def check_cap(self, cap: int) -> None:
        """SizingError unless ``cap`` is within 1..max_cap_tokens: no part sizes, advises or asks about another."""
        if not 1 <= cap <= self.max_cap_tokens:
            raise SizingError(f"cap {cap} is outside 1..{self.max_cap_tokens} tokens per rank, the range capwatch "
                              f"sizes for the {self.name} A2A")

    def env_line(self, cap: int) -> str:
        """``VAR=cap``: the line an operator exports."""
        return f"{self.cap_env_var}={cap}"
