"""The alignment stage: a cap is a multiple of the policy's alignment (``CAP_ALIGNMENT``, 128), rounded up —
never down, which would undercut the peaks — within [min_cap, max_cap] (the rounding: ``sizing/caps.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capwatch.service.advisor.stage import Step
from capwatch.sizing.caps import align_down, align_up

if TYPE_CHECKING:
    from capwatch.service.advisor.evidence import Evidence


def align(given: Evidence, sized: float) -> Step[float]:
    """The floor outranks max_cap: a cap below it is one the server refuses to start with."""
    policy, floor_cap = given.policy, given.floor_cap
    ceiling = max(align_down(policy.max_cap, policy.alignment),
                  align_up(floor_cap, policy.alignment) if floor_cap else 0)
    return Step(min(align_up(max(sized, policy.min_cap), policy.alignment), ceiling))
