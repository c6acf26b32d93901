"""Sustained growth or decline of the group's daily peaks (Mann-Kendall test, Theil-Sen slope).

A day's peak is the largest window peak of that UTC day (days with less than ``min_day_coverage`` of
their windows seen are left out: a half day's peak reads as a decline). On the log of the daily
peaks, Mann-Kendall's S counts rising minus falling pairs; its exact null distribution (all orders
equally likely, computed by the recurrence for small n, the normal approximation with tie
correction above) gives a two-sided p-value. Only a trend with p below ``alpha`` AND a Theil-Sen
growth rate of at least ``min_rate_per_day`` counts: noisy flat traffic moves neither. The slope
is the median of pairwise slopes, robust to a burst day. Pure functions; no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from capwatch.service.advisor.stage import Step

if TYPE_CHECKING:  # evidence.py measures with daily_trend() below
    from capwatch.service.advisor.evidence import Evidence


@dataclass(frozen=True)
class Trend:
    days: int  # full days used
    rate_per_day: float  # Theil-Sen slope of ln(daily peak): 0.05 = +5 % a day
    p_value: float
    significant: bool
    level_tokens: float  # the fitted daily peak at the latest day

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
    s = sum((values[j] > values[i]) - (values[j] < values[i]) for i in range(n) for j in range(i + 1, n))
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
    ties: dict[float, int] = {}
    for value in values:
        ties[value] = ties.get(value, 0) + 1
    variance = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0
    if variance <= 0.0:
        return s, 1.0
    z = (s - math.copysign(1, s)) / math.sqrt(variance) if s else 0.0
    return s, math.erfc(abs(z) / math.sqrt(2.0))


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


def size_for_trend(given: Evidence, sized: float) -> Step[float]:
    """Growth: scale the sized cap by the growth the trend predicts over the horizon. Decline: said,
    not acted on (the remembered peaks decay on their own; a cap sized too small crashes)."""
    found, policy = given.trend, given.policy
    if found is None:
        return Step(sized)
    horizon_days = policy.trend_horizon_s / 86_400.0
    described = (f"daily peaks over {found.days} full days {'grow' if found.rate_per_day > 0 else 'shrink'} "
                 f"{abs(math.expm1(found.rate_per_day)):.1%} a day (Theil-Sen; Mann-Kendall p={found.p_value:.2g})")
    if not found.significant:
        return Step(sized, (f"no sustained trend: {described}, below the bar of p<{policy.trend_alpha:g} "
                            f"and {policy.trend_min_rate_per_day:.0%} a day",))
    if found.rate_per_day < 0:
        return Step(sized, (f"{described}: not sized below the remembered peaks, which decay on their own",))
    growth = math.exp(found.rate_per_day * horizon_days)
    return Step(sized * growth, (f"{described}: sized for the peak expected {horizon_days:g} days ahead, "
                                 f"x{growth:.3f} -> {sized * growth:.0f} tokens",))
