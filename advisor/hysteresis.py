"""The last stage: changing the cap needs a restart, so only act when it matters (VPA's updater rule): the
current cap lies outside [lower, upper], or enough time is covered by samples (not merely spanned) and the
change is big. A cap that is being exceeded, or that sits below the floor, is raised now."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from capwatch.advisor.advice import Decision
from capwatch.advisor.stage import Step, duration, pct
from capwatch.engines import ENGINE
from capwatch.sizing.caps import align_down, align_up

if TYPE_CHECKING:
    from capwatch.advisor.evidence import Evidence


def worth_changing(current_cap: int, recommended_cap: int, lower_bound: int, upper_bound: int,
                   covered_history_s: float, min_history_s: float, min_change_ratio: float) -> tuple[bool, str]:
    """Whether moving the current cap to the recommendation is worth a restart, and why: the test that decided,
    with its figures, and (for a hold) what would change the answer."""
    if recommended_cap == current_cap:
        return False, f"the sized cap is the current cap {current_cap}: nothing to change"
    if current_cap < lower_bound:
        return True, f"the current cap {current_cap} is below the lower bound {lower_bound}"
    if current_cap > upper_bound:
        return True, f"the current cap {current_cap} is above the upper bound {upper_bound}"
    change = abs(recommended_cap - current_cap) / current_cap
    short, small = covered_history_s < min_history_s, change < min_change_ratio
    if not short and not small:
        return True, (f"{change:.0%} change after {duration(covered_history_s)} of covered history (acting on changes "
                      f"of at least {min_change_ratio:.0%} once {duration(min_history_s)} is covered)")
    failed = []
    if short:
        failed.append(f"{duration(covered_history_s)} of covered history is less than the {duration(min_history_s)} "
                      "a change inside the bounds waits for (CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S)"
                      + ("" if small else f": if the peaks stay as they are, the {change:.0%} change to "
                         f"{recommended_cap} is advised once {duration(min_history_s - covered_history_s)} more is "
                         "covered"))
    if small:
        failed.append(f"a {change:.0%} change to {recommended_cap} is less than the {min_change_ratio:.0%} worth a "
                      f"restart (CAPWATCH_ADVISOR__CHANGE_MIN_RATIO): only a sized cap of at most "
                      f"{math.floor(current_cap * (1 - min_change_ratio) + 1e-9)} or at least "
                      f"{math.ceil(current_cap * (1 + min_change_ratio) - 1e-9)} would be")
    return False, f"holding {current_cap}, within the bounds [{lower_bound}, {upper_bound}]: " + "; and ".join(failed)


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
    if not given.group.cap_known:
        return "set", _unknown_cap(given, target, lower, upper)
    overflowed = given.history.overflow_windows > 0
    if (overflow_now > 0.0 or overflowed and current < target) and target > current:
        return "raise", (f"{pct(overflow_now)} of windows (decay-weighted) peaked above the current cap {current}"
                         if overflow_now > 0.0 else
                         f"{given.history.overflow_windows:,} window(s) overflowed the current cap {current}")
    if floor_cap is not None and current < floor_cap and target > current:
        return "raise", f"the current cap {current} is below the floor {floor_cap}"
    history, policy = given.history, given.policy
    if given.short_history:
        if target > current:
            return "raise", (f"the peaks ask for {target}, above the current cap {current}: a raise does not wait for "
                             "history")
        return "hold", (f"not lowering yet: {history.sample_count:,} sample(s) covering {duration(history.covered_s)}, "
                        f"and a lower waits for {policy.min_samples} samples covering {duration(policy.min_history_s)} "
                        "(CAPWATCH_ADVISOR__MIN_SAMPLES, CAPWATCH_ADVISOR__MIN_HISTORY_S)")
    change, why = worth_changing(current, target, lower, upper, history.covered_s, policy.change_min_history_s,
                                 policy.change_min_ratio)
    if not change:
        return "hold", why
    if target > current:
        return "raise", why
    missed = _band_misses_target(given, target) if given.low_confidence else None
    return ("hold", f"not lowering {current} -> {target} ({why}): {missed}") if missed else ("lower", why)


def _band_misses_target(given: Evidence, cap: int) -> str | None:
    """Why ``cap``'s predicted overflows do not meet the target at their band's high end (None: they do). While
    confidence is low a lower on less evidence than that is not advised, however far the peaks sit below the current
    cap; past it the bounds decide (without a tail fit the distribution-free band above the largest sample would
    otherwise hold every cap for 90 days: docs/advisor.md)."""
    model, target = given.tail, given.policy.target_overflow_windows_per_day
    low, high = model.band(cap)
    if high <= target:
        return None
    text = (f"at {cap} the predicted overflowing windows a day are {model.overflow_windows_per_day(cap):.3g} "
            f"(band up to {high:.3g}), above the target of {target:.3g} (one in {1 / target:.0f} days, "
            "CAPWATCH_ADVISOR__TARGET_OVERFLOW_WINDOWS_PER_DAY): the history cannot rule overflows out at that cap")
    if model.fit is None and model.histogram.share_above(cap) == 0.0:
        needed = 3.0 * model.windows_per_day / target  # the rule of three: 3 / n per window with none above
        text += (f"; with no window above it the band's high end meets the target after {needed:,.0f} windows "
                 f"(now {model.effective_samples:,.0f}), sooner once a tail fit takes over "
                 f"({given.policy.tail_min_exceedances} windows above the p{100 * model.threshold_quantile:g} "
                 "threshold)")
    else:
        text += "; more history narrows the band"
    return text


def _unknown_cap(given: Evidence, target: int, lower: int, upper: int) -> str:
    """The reason of a "set": the cap in use is unknown; what bounds it; what to set."""
    group, rules = given.group, given.rules
    text = (f"the cap in use is unknown: nothing read shows {rules.cap_env_var} (an environment variable) and no "
            f"overflow assertion gives it; {group.cap} is assumed ({ENGINE.TITLE}'s default), not known")
    at_least = group.cap_at_least
    if at_least is not None and at_least > group.cap:
        text += (f", and cannot be it: batches reached {at_least} tokens without an overflow assertion, and the "
                 f"{rules.name} A2A asserts on any batch above its cap, so the cap in use is at least {at_least}")
    elif at_least is not None:
        text += f"; batches reached {at_least} tokens without an overflow assertion: the cap in use is at least that"
    return (text + f". Set {target} (bounds {lower} - {upper}); nothing is priced or decided against the assumed "
            f"{group.cap}")


def decide(given: Evidence, sized: float) -> Step[Decision]:
    """Hold the current cap, or move to the sized target: the advice's ``Decision`` and why."""
    target = int(sized)
    lower, upper = bounds(given, target)
    action, why = _action(given, target, lower, upper)
    recommended = given.current_cap if action == "hold" else target
    return Step(Decision(action=action, recommended_cap=recommended, target_cap=target, lower_bound=lower,
                         upper_bound=upper, confidence=round(given.peaks.confidence, 4),
                         env=given.rules.env_line(recommended), low_confidence=given.low_confidence), (why,))
