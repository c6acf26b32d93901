"""The alignment stage: a cap is a multiple of the policy's alignment (``CAP_ALIGNMENT``, 128; with the backend's
own requirement folded in, ``AdvisorPolicy.for_backend``), rounded up — never down, which would undercut the
peaks — within [min_cap, max_cap] (the rounding: ``sizing/caps.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capwatch.service.advisor.stage import Step
from capwatch.sizing.caps import align_down, align_up

if TYPE_CHECKING:
    from capwatch.service.advisor.evidence import Evidence


def align(given: Evidence, sized: float) -> Step[float]:
    """The floor outranks the policy's max_cap (a cap below it is one the server cannot run with), but not the
    most the backend accepts (a cap above that is refused at start-up): where the two clash, the backend's
    limit wins and the reason says what to change."""
    policy, floor_cap, rules = given.policy, given.floor_cap, given.rules
    hard = align_down(rules.max_cap_tokens, policy.alignment)
    ceiling = min(max(align_down(policy.max_cap, policy.alignment),
                      align_up(floor_cap, policy.alignment) if floor_cap else 0), hard)
    wanted = align_up(max(sized, policy.min_cap), policy.alignment)
    reasons = []
    if rules.required_alignment > 1 and wanted != max(sized, policy.min_cap):
        reasons.append(f"rounded up to {wanted}, a multiple of {policy.alignment}: {rules.why_aligned}")
    if wanted > hard:
        reasons.append(f"capped at {hard}, the most the {rules.name} backend takes ({rules.why_max}); the estimate "
                       f"wanted {wanted}: past {hard} only a smaller per-rank batch helps (more DP ranks, or a lower "
                       "--max-running-requests)")
    if floor_cap and align_up(floor_cap, policy.alignment) > hard:
        reasons.append(f"the floor {floor_cap} ({given.floor.binds}) is above {hard}: {given.floor.why}; lower "
                       f"--cuda-graph-max-bs (or the prefill chunk) until the floor is at most {hard}")
    return Step(min(wanted, ceiling), tuple(reasons))
