"""Sustained growth or decline of the group's peaks (Mann-Kendall test, Theil-Sen slope).

A day's peak is the largest window peak of that UTC day (days with less than ``min_day_coverage`` of
their windows seen are left out: a half day's peak reads as a decline). On the log of the daily
peaks, Mann-Kendall's S counts rising minus falling pairs; its exact null distribution (all orders
equally likely, computed by the recurrence for small n, the normal approximation with tie
correction above) gives a two-sided p-value. Only a trend with p below ``alpha`` AND a Theil-Sen
growth rate of at least ``min_rate_per_day`` counts: noisy flat traffic moves neither. The slope
is the median of pairwise slopes, robust to a burst day.

Three or four daily peaks cannot reach that bar (the smallest p of 3 ordered values is 1/3), so a short
history is read hour by hour instead (``hourly_trend``): each hour of the day against the same hour on the
other days — the seasonal Mann-Kendall test (Hirsch, Slack & Smith 1982: the hours' S and variances summed)
and the seasonal Theil-Sen slope (the median of the within-hour slopes), which the daily rhythm does not
disturb. Growth there must also be sustained: every day over the day before, by at least a third of the
fitted rate (a single busier day moves many hours at once, and is not a trend). Pure functions; no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from capwatch.advisor.stage import Step

if TYPE_CHECKING:  # evidence.py measures with daily_trend() below
    from capwatch.advisor.evidence import Evidence


@dataclass(frozen=True)
class Trend:
    days: int  # full days used
    rate_per_day: float  # Theil-Sen slope of ln(daily peak): 0.05 = +5 % a day
    p_value: float
    significant: bool
    level_tokens: float  # the fitted daily peak at the latest day
    basis: str = "daily peaks"  # or "hourly peaks" (a short history: the same hour across days)
    day_steps: tuple[float, ...] = ()  # hourly: each day's median ln-change over the day before, oldest first

    def projected(self, days_ahead: float) -> float:
        return self.level_tokens * math.exp(self.rate_per_day * days_ahead)


@lru_cache(maxsize=64)
def _kendall_counts(n: int) -> tuple[int, ...]:
    """Number of permutations of n items with each inversion count (Mahonian numbers)."""
    counts = [1]
    for size in range(2, n + 1):
        new = [0] * (len(counts) + size - 1)
        for inversions, ways in enumerate(counts):
            for extra in range(size):
                new[inversions + extra] += ways
        counts = new
    return tuple(counts)


def mann_kendall_p(values: list[float]) -> tuple[int, float]:
    """(S, two-sided p) of the Mann-Kendall trend test."""
    n = len(values)
    s = _mann_kendall_s(values)
    if n < 3:
        return s, 1.0
    has_ties = len(set(values)) < n
    if n <= 12 and not has_ties:
        counts = _kendall_counts(n)
        total = math.factorial(n)
        pairs = n * (n - 1) // 2
        # S = pairs - 2 * inversions; P(|S| >= |s|)
        extreme = sum(ways for inversions, ways in enumerate(counts) if abs(pairs - 2 * inversions) >= abs(s))
        return s, min(1.0, extreme / total)
    return s, _two_sided_p(s, _mann_kendall_variance(values))


def _mann_kendall_s(values: list[float]) -> int:
    """Rising minus falling pairs."""
    n = len(values)
    return sum((values[j] > values[i]) - (values[j] < values[i]) for i in range(n) for j in range(i + 1, n))


def _mann_kendall_variance(values: list[float]) -> float:
    """S's variance under no trend, with the tie correction."""
    n = len(values)
    ties: dict[float, int] = {}
    for value in values:
        ties[value] = ties.get(value, 0) + 1
    return (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0


def _two_sided_p(s: int, variance: float) -> float:
    """The normal approximation, with continuity correction."""
    if variance <= 0.0:
        return 1.0
    z = (s - math.copysign(1, s)) / math.sqrt(variance) if s else 0.0
    return math.erfc(abs(z) / math.sqrt(2.0))


def theil_sen(days: list[float], values: list[float]) -> tuple[float, float]:
    """(slope per day, the line's value at the last day) of the median pairwise slope line. Slopes are
    taken over the days between two points, so days missing in between do not steepen it."""
    n = len(values)
    slope = _median([(values[j] - values[i]) / (days[j] - days[i]) for i in range(n) for j in range(i + 1, n)])
    intercept = _median([value - slope * day for day, value in zip(days, values)])
    return slope, intercept + slope * days[-1]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def daily_trend(daily_peaks: list[tuple[int, int]], alpha: float, min_days: int,
                min_rate_per_day: float) -> Trend | None:
    """From (day number, peak) pairs, oldest first; None with fewer than ``min_days`` full days or no
    positive peak. Mann-Kendall reads only the order; Theil-Sen the days between points."""
    kept = [(day, peak) for day, peak in daily_peaks if peak > 0]
    if len(kept) < max(min_days, 3):
        return None
    days = [float(day) for day, _ in kept]
    logs = [math.log(peak) for _, peak in kept]
    _, p_value = mann_kendall_p(logs)
    slope, level = theil_sen(days, logs)
    significant = p_value < alpha and abs(slope) >= min_rate_per_day
    return Trend(len(kept), slope, p_value, significant, math.exp(level))


def hourly_trend(hourly_peaks: list[tuple[int, int]], alpha: float, min_days: int,
                 min_rate_per_day: float) -> Trend | None:
    """From (hour number, peak) pairs, oldest first: each hour of the day compared with the same hour on the
    other days. None when they span fewer than ``min_days`` days or no hour of the day was seen twice."""
    kept = [(hour, peak) for hour, peak in hourly_peaks if peak > 0]
    if not kept or (kept[-1][0] - kept[0][0] + 1) < min_days * 24:
        return None
    seasons: dict[int, list[tuple[int, float]]] = {}
    for hour, peak in kept:
        seasons.setdefault(hour % 24, []).append((hour // 24, math.log(peak)))
    seasons = {season: values for season, values in seasons.items() if len(values) >= 2}
    if not seasons:
        return None
    s_total, variance = 0, 0.0
    slopes: list[float] = []
    for values in seasons.values():
        logs = [value for _, value in values]
        s_total += _mann_kendall_s(logs)
        variance += _mann_kendall_variance(logs)
        slopes += [(values[j][1] - values[i][1]) / (values[j][0] - values[i][0])
                   for i in range(len(values)) for j in range(i + 1, len(values))]
    p_value = _two_sided_p(s_total, variance)
    slope = _median(slopes)
    steps = _day_steps(seasons)
    sustained = bool(steps) and all(step * slope > 0 and abs(step) >= abs(slope) / 3 for step in steps)
    significant = p_value < alpha and abs(slope) >= min_rate_per_day and sustained
    last_day = kept[-1][0] // 24
    level = max(math.exp(value) for values in seasons.values() for day, value in values if day == last_day)
    days = round((kept[-1][0] - kept[0][0] + 1) / 24)
    return Trend(days, slope, p_value, significant, level, "hourly peaks", steps)


def _day_steps(seasons: dict[int, list[tuple[int, float]]]) -> tuple[float, ...]:
    """Each day's median ln-change of an hour's peak over the same hour the day before, oldest first."""
    changes: dict[int, list[float]] = {}
    for values in seasons.values():
        by_day = dict(values)
        for day, value in values:
            if day - 1 in by_day:
                changes.setdefault(day, []).append(value - by_day[day - 1])
    return tuple(_median(changes[day]) for day in sorted(changes))


def size_for_trend(given: Evidence, sized: float) -> Step[float]:
    """Growth: scale the sized cap by the growth the trend predicts over the horizon. Decline: said,
    not acted on (the remembered peaks decay on their own; a cap sized too small crashes)."""
    found, policy = given.trend, given.policy
    if found is None:
        return Step(sized)
    horizon_days = policy.trend_horizon_s / 86_400.0
    direction = "grow" if found.rate_per_day > 0 else "shrink"
    if found.basis == "hourly peaks":
        each_day = ", ".join(f"{math.expm1(step):+.1%}" for step in found.day_steps)
        described = (f"hourly peaks over {found.days} days, each hour against the same hour on the other days, "
                     f"{direction} {abs(math.expm1(found.rate_per_day)):.1%} a day (day over day: {each_day}; "
                     f"seasonal Theil-Sen; seasonal Mann-Kendall p={found.p_value:.2g})")
    else:
        described = (f"daily peaks over {found.days} full days {direction} "
                     f"{abs(math.expm1(found.rate_per_day)):.1%} a day (Theil-Sen; Mann-Kendall p={found.p_value:.2g})")
    if not found.significant:
        bar = f"p<{policy.trend_alpha:g} and {policy.trend_min_rate_per_day:.0%} a day"
        if found.basis == "hourly peaks":
            bar += ", every day over the one before"
        return Step(sized, (f"no sustained trend: {described}, below the bar of {bar}",))
    if found.rate_per_day < 0:
        return Step(sized, (f"{described}: not sized below the remembered peaks, which decay on their own",))
    growth = math.exp(found.rate_per_day * horizon_days)
    return Step(sized * growth, (f"{described}: sized for the peak expected {horizon_days:g} days ahead, "
                                 f"x{growth:.3f} -> {sized * growth:.0f} tokens",))
