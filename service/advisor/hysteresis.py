"""Changing the cap needs a restart, so only act when it matters (VPA's updater rule): the
current cap lies outside [lower, upper], or enough time is covered by samples (not merely spanned) and the change is big."""

from __future__ import annotations


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
