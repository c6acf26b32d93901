"""The words every layer spells the same way (the dispatcher, its telemetry, the service, the CLI):
``Literal`` types with their tuples for run-time checks. Torch-free, imports nothing.

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

ROLES: tuple[Role, ...] = get_args(Role)
OVERFLOW_POLICIES: tuple[OverflowPolicy, ...] = get_args(OverflowPolicy)
OVERFLOW_KINDS: tuple[OverflowKind, ...] = get_args(OverflowKind)
OVERFLOW_OUTCOMES: tuple[OverflowOutcome, ...] = get_args(OverflowOutcome)
