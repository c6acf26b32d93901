"""The A2A backends capwatch knows, each with the rules of its per-rank cap: the variable SGLang reads
the cap from, the alignment and range capwatch advises within, and what happens below its floor.

One entry per backend, keyed by the name SGLang's ``--moe-a2a-backend`` gives it; every part that names a
cap's variable or bounds a cap takes it from here. A backend's buffer layout is its own module beside
``flashinfer_moe_a2a`` and ``deepep_low_latency`` (docs/sizing.md, "Adding a backend", lists the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.caps import CAP_ALIGNMENT, MAX_CAP_TOKENS
from capwatch.sizing.checks import SizingError
from capwatch.sizing.deepep_low_latency import MAX_DISPATCH_TOKENS_PER_RANK
from capwatch.sizing.deepep_plan import SGLANG_DEEPEP_DEFAULT_CAP, SGLANG_DEEPEP_RESERVE_BYTES


@dataclass(frozen=True)
class BackendCapRules:
    name: str  # as SGLang's --moe-a2a-backend spells it
    cap_env_var: str  # where SGLang reads the per-rank cap from
    alignment: int = CAP_ALIGNMENT  # caps capwatch suggests are multiples of this
    max_cap_tokens: int = MAX_CAP_TOKENS  # the largest cap the backend accepts
    # Caps must be multiples of this or the backend misbehaves (1: any cap works); the advice's alignment
    # is a multiple of it whatever the advisor's policy says.
    required_alignment: int = 1
    why_aligned: str = ""  # what a cap off that alignment breaks
    why_max: str = ""  # who refuses a cap above max_cap_tokens
    default_cap: int | None = None  # SGLang's default when the variable is unset (None: a rule, not a number)
    # What happens below SGLang's floor terms (None: SGLang's own start-up check where the release has one,
    # advisor/floor.py sglang_floor_why).
    below_floor: str | None = None
    # Whether eager prefill batches go through this backend's dispatch on every release (FlashInfer's go through
    # an all-gather on the releases without SGLang's own floor rule, so the prefill chunk is no term there).
    eager_prefill_dispatched: bool = False
    # The backend checks each rank's own batch against the cap (DeepEP), not a group-wide R (FlashInfer's
    # runtime_max_tokens_per_rank): R is the local batch, and an overflow message says so.
    local_batch_cap: bool = False
    overflow_outcome: str = "the dispatch is refused"  # what a batch above the cap does, in words
    memory: str = "workspace"  # what the cap sizes, in the advice's words
    sized_by: str = "FlashInfer's formula"  # what capwatch prices it with, in the findings' words
    mismatch_hint: str = "check flashinfer_version and the payload sizes"  # where a reported size that differs comes from
    # A known bug sized this backend's memory for cap x ep_size tokens per rank (sglang PR #25907, FlashInfer's
    # max_num_tokens): the service's findings name it when a rank's reported size matches that.
    sized_for_group_bug: bool = False
    # What SGLang's automatic --mem-fraction-static sets aside for this backend's buffers, whatever the cap
    # (None: nothing of its own: the buffer comes out of what the KV pool would get).
    sglang_reserve_bytes: int | None = None

    def check_cap(self, cap: int) -> None:
        """SizingError unless ``cap`` is within 1..max_cap_tokens: no part sizes, advises or asks about another."""
        if not 1 <= cap <= self.max_cap_tokens:
            raise SizingError(f"cap {cap} is outside 1..{self.max_cap_tokens} tokens per rank, the range capwatch "
                              f"sizes for the {self.name} A2A")

    def env_line(self, cap: int) -> str:
        """``VAR=cap``: the line an operator exports."""
        return f"{self.cap_env_var}={cap}"


FLASHINFER = BackendCapRules("flashinfer", "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
                             sized_for_group_bug=True)
DEEPEP = BackendCapRules(
    "deepep", "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", max_cap_tokens=MAX_DISPATCH_TOKENS_PER_RANK,
    required_alignment=128,
    why_aligned="a cap off a multiple of 128 corrupts DeepEP's FP8 scales (sglang#28994)",
    why_max=f"SGLang asserts the cap <= {MAX_DISPATCH_TOKENS_PER_RANK} at start-up",
    default_cap=SGLANG_DEEPEP_DEFAULT_CAP,
    below_floor="DeepEP's dispatch assertion ends the rank below it (at CUDA-graph capture or the first full batch)",
    eager_prefill_dispatched=True, local_batch_cap=True, overflow_outcome="DeepEP's dispatch assertion ends the rank",
    memory="buffer", sized_by="DeepEP's size hints as SGLang adds them",
    mismatch_hint="check --deepep-config, the redundant and the fused shared experts",
    sglang_reserve_bytes=SGLANG_DEEPEP_RESERVE_BYTES)

BACKENDS: dict[str, BackendCapRules] = {rules.name: rules for rules in (FLASHINFER, DEEPEP)}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)


def backend_rules(name: str) -> BackendCapRules:
    """The rules of the backend SGLang calls ``name``; SizingError naming the known ones otherwise."""
    rules = BACKENDS.get(name)
    if rules is None:
        raise SizingError(f"capwatch does not size the {name!r} A2A backend; it knows {', '.join(sorted(BACKENDS))}")
    return rules
