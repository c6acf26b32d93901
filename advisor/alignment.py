"""The alignment stage: a cap is a multiple of the policy's alignment (``CAP_ALIGNMENT``, 128; with the backend's
own requirement folded in, ``AdvisorPolicy.for_backend``), rounded up — never down, which would undercut the
peaks — within [min_cap, the ceiling] (the rounding: ``sizing/caps.py``).

The ceiling is the one range every cap the advisor produces lies in: the policy's ``max_cap``, raised to SGLang's
start-up floor (a cap below it is one the server refuses to start with), and never above the largest cap the
group's A2A backend takes (its spec in ``backends/``). A floor above that leaves no cap that both starts the server
and fits the backend: the group cannot be advised, and says why (a ``SizingError``, answered 409)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capwatch.advisor.stage import Step
from capwatch.sizing.caps import align_down, align_up
from capwatch.sizing.checks import SizingError

if TYPE_CHECKING:
    from capwatch.advisor.evidence import Evidence


def cap_ceiling(given: Evidence) -> int:
    """The largest cap the advisor may produce for this group (see the module's docstring)."""
    policy, floor, rules = given.policy, given.floor, given.rules
    hard = align_down(rules.max_cap_tokens, policy.alignment)
    if floor is not None and align_up(floor.tokens, policy.alignment) > hard:
        raise SizingError(f"the floor is {floor.tokens} tokens ({floor.binds}; {floor.why}), above "
                          f"{hard}, the largest cap the {rules.name} A2A takes: no cap both starts "
                          "these ranks and fits; lower --cuda-graph-max-bs (or the prefill chunk, or the speculative "
                          f"tokens) until the floor is at most {hard}")
    wanted = max(align_down(policy.max_cap, policy.alignment), align_up(floor.tokens, policy.alignment) if floor else 0)
    return min(wanted, hard)


def align(given: Evidence, sized: float) -> Step[float]:
    """The floor outranks the policy's max_cap (a cap below it is one the server cannot run with); the most the
    backend accepts outranks the estimate, and the reason says what else helps."""
    policy, rules, ceiling = given.policy, given.rules, given.cap_ceiling
    wanted = align_up(max(sized, policy.min_cap), policy.alignment)
    reasons = []
    if rules.required_alignment > 1 and wanted != max(sized, policy.min_cap):
        reasons.append(f"rounded up to {wanted}, a multiple of {policy.alignment}: {rules.why_aligned}")
    hard = align_down(rules.max_cap_tokens, policy.alignment)
    if wanted > hard:
        reasons.append(f"capped at {hard}, the most the {rules.name} backend takes ({rules.why_max}); the estimate "
                       f"wanted {wanted}: past {hard} only a smaller per-rank batch helps (more DP ranks, or a lower "
                       "--max-running-requests)")
    return Step(min(wanted, ceiling), tuple(reasons))
