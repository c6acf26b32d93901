"""capwatch's shared vocabulary, torch-free: the names every layer spells the same way.

One place for the words (as ``Literal`` types, with their tuples for run-time checks), the cap's
environment variable and its alignment. Kept apart from ``counters.py`` (which needs torch) so that
the telemetry report schema, the service and the CLI use it without importing torch (about 2 s).

``("local_over_runtime", "chunked")`` never happens (a rank with more local tokens than R is always
raised: the other ranks cannot know to chunk), but it stays in the product of kinds and outcomes
so that every exported series and report schema keeps one fixed shape.
"""

from __future__ import annotations

from typing import Literal, get_args

# Which dispatcher of a rank: the target model's, a speculative draft model's, or SGLang's
# sequence-parallel prefill A2A (its own workspace and counters). A role added here (one word in the
# Literal) is accepted by the counters, the report schema and the service alike.
Role = Literal["target", "draft", "sp_prefill"]
# What the dispatcher does past the cap: raise CapOverflowError, or split the step into cap-sized rounds.
OverflowPolicy = Literal["raise", "chunk"]
# runtime_over_cap: R > cap; local_over_runtime: a rank's local tokens > R.
OverflowKind = Literal["runtime_over_cap", "local_over_runtime"]
OverflowOutcome = Literal["raised", "chunked"]
# The advisor's verdict on the cap.
Action = Literal["raise", "lower", "hold", "insufficient_data"]
# A rank as the service sees it: reporting, late (stale) or gone (missing).
RankState = Literal["reporting", "stale", "missing"]

ROLES: tuple[Role, ...] = get_args(Role)
OVERFLOW_POLICIES: tuple[OverflowPolicy, ...] = get_args(OverflowPolicy)
OVERFLOW_KINDS: tuple[OverflowKind, ...] = get_args(OverflowKind)
OVERFLOW_OUTCOMES: tuple[OverflowOutcome, ...] = get_args(OverflowOutcome)
ACTIONS: tuple[Action, ...] = get_args(Action)
RANK_STATES: tuple[RankState, ...] = get_args(RankState)

# The per-rank token cap, as SGLang reads it (sglang 0.5.23, FlashInfer A2A backend).
CAP_ENV_VAR = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
# Caps capwatch suggests are multiples of this many tokens.
CAP_ALIGNMENT = 128
# The largest cap any part accepts (the report schema, the CLI): beyond it is a typo or an attack.
MAX_CAP_TOKENS = 1 << 20


def align_up(value: int | float, alignment: int = CAP_ALIGNMENT) -> int:
    """The smallest multiple of ``alignment`` at or above ``value`` (0 stays 0): the one align-up
    for token caps and byte offsets alike."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    return int(-(-value // alignment)) * alignment


def align_down(value: int | float, alignment: int = CAP_ALIGNMENT) -> int:
    """The largest multiple of ``alignment`` at or below ``value``."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    return int(value // alignment) * alignment
