"""The last stage: changing the cap needs a restart, so only act when it matters (VPA's updater rule): the
current cap lies outside [lower, upper], or enough time is covered by samples (not merely spanned) and the
change is big. A cap that is being exceeded, or that sits below the floor, is raised now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capwatch.advisor.advice import Decision
from capwatch.advisor.stage import Step, pct
from capwatch.sizing.caps import align_down, align_up

if TYPE_CHECKING:
    from capwatch.advisor.evidence import Evidence


def worth_changing(current_cap: int, recommended_cap: int, lower_bound: int, upper_bound: int,
                   covered_history_s: float, min_history_s: float, min_change_ratio: float) -> tuple[bool, str]:
    if recommended_cap == current_cap:
        return False, "the recommendation equals the current cap"
    if current_cap < lower_bound:
        return True, f"the current cap {current_cap} is below the lower bound {lower_bound}"
    if current_cap > upper_bound:
        return True, f"the current cap {current_cap} is above the upper bound {upper_bound}"
    change = abs(recommended_cap - current_cap) / current_cap
    if covered_history_s >= min_history_s and change >= min_change_ratio:
        return True, (f"{change:.0%} change after {covered_history_s / 3600:.1f} h of covered history "
                      f"(acting on changes of at least {min_change_ratio:.0%} once {min_history_s / 3600:.1f} h is seen)")
    return False, (f"the current cap {current_cap} lies within [{lower_bound}, {upper_bound}] and a "
                   f"{change:.0%} change is not worth a restart")


def bounds(given: Evidence, target_cap: int) -> tuple[int, int]:
    """[lower, upper] the current cap may sit in without a change: the peaks estimate's bounds, aligned, never
    below the floor nor above the advisor's ceiling (``alignment.cap_ceiling``), and around the target."""
    found, alignment, floor_cap = given.peaks, given.policy.alignment, given.floor_cap
    lower = min(align_down(found.lower_tokens, alignment) or alignment, given.cap_ceiling)
    upper = min(align_up(found.upper_tokens, alignment), given.cap_ceiling)
    if floor_cap is not None:
        lower = max(lower, floor_cap)
    return min(lower, target_cap), max(upper, target_cap)


def _action(given: Evidence, target: int, lower: int, upper: int) -> tuple[str, str]:
    current, floor_cap, overflow_now = given.current_cap, given.floor_cap, given.overflow_now
    overflowed = given.history.overflow_windows > 0
    if (overflow_now > 0.0 or overflowed and current < target) and target > current:
        return "raise", f"{pct(overflow_now)} of windows peaked above the current cap {current}"
    if floor_cap is not None and current < floor_cap and target > current:
        return "raise", f"the current cap {current} is below the floor {floor_cap}"
    if given.short_history:
        return ("hold" if target <= current else "raise"), "history is still short: not lowering yet"
    policy = given.policy
    change, why = worth_changing(current, target, lower, upper, given.history.covered_s, policy.change_min_history_s,
                                 policy.change_min_ratio)
    return (("raise" if target > current else "lower") if change else "hold"), why


def decide(given: Evidence, sized: float) -> Step[Decision]:
    """Hold the current cap, or move to the sized target: the advice's ``Decision`` and why."""
    target = int(sized)
    lower, upper = bounds(given, target)
    action, why = _action(given, target, lower, upper)
    recommended = given.current_cap if action == "hold" else target
    return Step(Decision(action=action, recommended_cap=recommended, target_cap=target, lower_bound=lower,
                         upper_bound=upper, confidence=round(given.peaks.confidence, 4),
                         env=given.rules.env_line(recommended)), (why,))
