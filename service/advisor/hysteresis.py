"""Changing the cap needs a restart, so only act when it matters (VPA's updater rule): the
current cap lies outside [lower, upper], or enough time is covered by samples (not merely spanned) and the change is big."""

from __future__ import annotations

from capwatch.service.advisor.stage import pct


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


def decide(current_cap: int, recommended_cap: int, lower_bound: int, upper_bound: int, overflow_now: float,
           overflow_windows: int, floor_cap: int | None, short_history: bool, covered_history_s: float,
           min_history_s: float, min_change_ratio: float) -> tuple[str, str]:
    """The last stage: (action, why). A cap that is being exceeded, or that sits below the floor,
    fails dispatches: raise now, whatever the hysteresis says. Everything else waits for a change
    worth a restart."""
    if (overflow_now > 0.0 or overflow_windows > 0 and current_cap < recommended_cap) and recommended_cap > current_cap:
        return "raise", f"{pct(overflow_now)} of windows peaked above the current cap {current_cap}"
    if floor_cap is not None and current_cap < floor_cap and recommended_cap > current_cap:
        return "raise", f"the current cap {current_cap} is below the floor {floor_cap}"
    if short_history:
        return ("hold" if recommended_cap <= current_cap else "raise"), "history is still short: not lowering yet"
    change, why = worth_changing(current_cap, recommended_cap, lower_bound, upper_bound, covered_history_s,
                                 min_history_s, min_change_ratio)
    return (("raise" if recommended_cap > current_cap else "lower") if change else "hold"), why
