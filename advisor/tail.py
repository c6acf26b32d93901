"""The tail of the group's window peaks: peaks over a threshold with a generalized Pareto fit.

Above a high threshold ``u`` (the weighted ``threshold_share`` quantile of the remembered window
peaks), excesses ``y = R - u`` follow a generalized Pareto law (Pickands-Balkema-de Haan):
``P(R > u + y | R > u) = (1 + shape * y / scale) ** (-1 / shape)`` (``exp(-y / scale)`` at shape 0).
So the share of windows above any cap, above the largest sample too, is
``share_above(u) * that survival``; times the windows per day, the expected overflowing windows per day.

The fit uses probability-weighted moments (Hosking & Wallis 1987): closed form, pure Python, sound
for the shapes traffic shows (shape < 0.5), and it takes the histogram's decayed weights as they are.
The uncertainty band is a seeded bootstrap of the exceedances (the same history gives the same band).
With fewer than ``min_exceedances`` effective exceedances there is no fit: the empirical histogram
answers, and its band's high end is the "rule of three" (3 / n per window when nothing was seen above).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from capwatch.advisor.histogram import DecayingHistogram, bucket_range
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.stage import Step

if TYPE_CHECKING:  # evidence.py measures with tail_model() below
    from capwatch.advisor.evidence import Evidence

SECONDS_PER_DAY = 86_400.0
_MAX_SHAPE = 0.2  # a prior: traffic is bounded (max running requests, KV room); shapes above 0.2 come from mixtures
# (bursts on a diurnal base) whose power-law extrapolation would size for bursts never seen
_MIN_SHAPE = -1.0  # below -1 the law is J-shaped at its end point: not a traffic tail
_BAND = (0.10, 0.90)  # the band is the 10th..90th percentile of the bootstrap


@dataclass(frozen=True)
class GeneralizedPareto:
    shape: float
    scale: float

    def survival(self, excess: float) -> float:
        if excess <= 0.0:
            return 1.0
        if abs(self.shape) < 1e-9:
            return math.exp(-excess / self.scale)
        base = 1.0 + self.shape * excess / self.scale
        return 0.0 if base <= 0.0 else base ** (-1.0 / self.shape)


def fit_pwm(excesses: list[float], weights: list[float] | None = None) -> GeneralizedPareto | None:
    """Hosking & Wallis' PWM estimator from (weighted) excesses; None if they carry no spread."""
    pairs = sorted(zip(excesses, weights or [1.0] * len(excesses)))
    total = sum(weight for _, weight in pairs)
    if total <= 0.0 or len(pairs) < 2:
        return None
    a0 = a1 = 0.0
    below = 0.0
    for excess, weight in pairs:
        survival = 1.0 - (below + weight / 2.0) / total  # plotting position, weighted
        a0 += weight * excess
        a1 += weight * excess * survival
        below += weight
    a0, a1 = a0 / total, a1 / total
    spread = a0 - 2.0 * a1
    if a0 <= 0.0 or a1 <= 0.0:
        return None
    # spread <= 0: mass piles up at the top (shape below -1, an end point just above the data): the
    # clamped shape -1 is a uniform excess up to 2 x the mean excess, above the data's end.
    shape = 2.0 - a0 / spread if spread > 0.0 else _MIN_SHAPE
    shape = min(max(shape, _MIN_SHAPE), _MAX_SHAPE)
    # scale from the mean excess with the (possibly clamped) shape: E[Y] = scale / (1 - shape)
    return GeneralizedPareto(shape, a0 * (1.0 - shape))


@dataclass(frozen=True)
class TailModel:
    """Predicted share of windows above a cap, from the empirical histogram below the threshold
    and the generalized Pareto fit above it (None: too few exceedances, empirical only)."""

    histogram: DecayingHistogram
    windows_per_day: float
    effective_samples: float
    threshold: int | None = None
    threshold_share: float = 0.0  # weighted share of windows above the threshold
    fit: GeneralizedPareto | None = None
    bootstrap: tuple[GeneralizedPareto, ...] = ()
    effective_exceedances: float = 0.0
    largest: int = 0
    threshold_quantile: float = 0.90
    rejected_fit: GeneralizedPareto | None = None  # a fit that disagreed with the data at every threshold
    no_spread: bool = False  # enough windows above the threshold, but all in one bucket: nothing to fit

    def share_above(self, cap: int) -> float:
        if self.fit is None or self.threshold is None or cap <= self.threshold:
            return self.histogram.share_above(cap)
        return self.threshold_share * self.fit.survival(cap - self.threshold)

    def overflow_windows_per_day(self, cap: int) -> float:
        return self.share_above(cap) * self.windows_per_day

    def band(self, cap: int) -> tuple[float, float]:
        """(low, high) expected overflowing windows per day at ``cap``."""
        point = self.overflow_windows_per_day(cap)
        if self.fit is None or self.threshold is None or cap <= self.threshold:
            # empirical: the count above is binomial; with none above, 3 / n bounds it (rule of three)
            seen = self.histogram.share_above(cap) * self.effective_samples
            high = (seen + 3.0 * math.sqrt(seen) if seen >= 1.0 else 3.0) / max(self.effective_samples, 1.0)
            low = max(0.0, seen - 3.0 * math.sqrt(seen)) / max(self.effective_samples, 1.0) if seen >= 1.0 else 0.0
            return min(low * self.windows_per_day, point), max(high * self.windows_per_day, point)
        rates = sorted(self.threshold_share * fit.survival(cap - self.threshold) * self.windows_per_day
                       for fit in self.bootstrap) or [point]
        low = rates[int(_BAND[0] * (len(rates) - 1))]
        high = rates[int(math.ceil(_BAND[1] * (len(rates) - 1)))]
        return min(low, point), max(high, point)

    def describe(self) -> str:
        if self.fit is None and self.rejected_fit is not None:
            return (f"no generalized Pareto fit agrees with the data (up to the p{100 * self.threshold_quantile:g} "
                    f"threshold, each expects more than {_MAX_EXPECTED_ABOVE_LARGEST:g} windows above the largest "
                    "sample, where none were seen): the empirical histogram predicts overflows")
        if self.fit is None and self.no_spread:
            return (f"the {self.effective_exceedances:.0f} windows above the p{100 * self.threshold_quantile:g} threshold "
                    "all lie within one histogram bucket (no tail to fit): the empirical histogram predicts overflows")
        if self.fit is None:
            return (f"{self.effective_exceedances:.0f} windows above the p{100 * self.threshold_quantile:g} threshold are "
                    "too few for a tail fit: the empirical histogram predicts overflows (above the largest sample its "
                    "band's high end is the distribution-free rule of three: 3 in as many windows as were seen)")
        kind = ("heavy (power-law)" if self.fit.shape > 0.05 else
                "bounded" if self.fit.shape < -0.05 else "exponential")
        return (f"generalized Pareto tail above {self.threshold} tokens ({self.effective_exceedances:.0f} "
                f"windows): shape {self.fit.shape:+.2f} ({kind}), scale {self.fit.scale:.0f} tokens")


def fit_tail(histogram: DecayingHistogram, windows_per_day: float, sample_count: int,
             threshold_quantile: float = 0.90, min_exceedances: int = 30, bootstrap_fits: int = 48,
             max_bootstrap_exceedances: int = 300) -> TailModel:
    """Fit the tail of the remembered window peaks (weights as the decay left them)."""
    items = sorted(histogram.weights.items())
    total = sum(weight for _, weight in items)
    if total <= 0.0:
        return TailModel(histogram, windows_per_day, 0.0, threshold_quantile=threshold_quantile)
    effective_samples = float(max(1, sample_count))
    largest = bucket_range(items[-1][0])[1]
    threshold = histogram.percentile(threshold_quantile)
    above = [(index, weight) for index, weight in items if bucket_range(index)[0] > threshold]
    threshold_share = sum(weight for _, weight in above) / total
    effective_exceedances = threshold_share * effective_samples
    base = TailModel(histogram, windows_per_day, effective_samples, threshold, threshold_share,
                     None, (), effective_exceedances, largest, threshold_quantile)
    if effective_exceedances < min_exceedances:
        return base
    if len(above) < 2:
        return replace(base, no_spread=True)
    excesses = [(bucket_range(index)[0] + bucket_range(index)[1]) / 2.0 - threshold for index, _ in above]
    weights = [weight for _, weight in above]
    fit = fit_pwm(excesses, weights)
    if fit is None:
        return replace(base, no_spread=True)
    # Seeded by the history itself: the same history always gives the same band.
    rng = random.Random(sample_count * 1_000_003 + len(above))
    draws = int(min(max_bootstrap_exceedances, max(effective_exceedances, 2)))
    fits = []
    for _ in range(bootstrap_fits):
        resample = rng.choices(excesses, weights=weights, k=draws)
        refit = fit_pwm(resample)
        if refit is not None:
            fits.append(refit)
    return TailModel(histogram, windows_per_day, effective_samples, threshold, threshold_share, fit,
                     tuple(fits), effective_exceedances, largest, threshold_quantile)


def windows_per_day(history: SampleHistory) -> float:
    """Group samples per day: one per window while traffic flows, fewer where the history has gaps."""
    full = SECONDS_PER_DAY / history.window_s
    if history.history_s <= 0.0:
        return full
    return min(full, history.sample_count * SECONDS_PER_DAY / max(history.history_s, history.window_s))


# Thresholds tried in turn (from the policy's up): the lowest whose fit agrees with the data is kept.
_HIGHER_THRESHOLDS = (0.95, 0.98, 0.99, 0.995)
_MAX_EXPECTED_ABOVE_LARGEST = 3.0  # Poisson: P(none seen | 3 expected) = 5 %


def expected_above_largest(model: TailModel) -> float:
    """How many windows the fit says should have peaked above the largest one remembered (none did)."""
    return model.share_above(model.largest) * model.effective_samples


def tail_model(history: SampleHistory, policy: AdvisorPolicy) -> TailModel:
    """Peaks over the lowest threshold whose fit is consistent with what was seen: a fit that expects
    more than 3 windows above the largest sample, where there were none, is rejected at 5 % (a mixture,
    e.g. diurnal peaks plus bursts, fitted too low), and a higher threshold is tried. None consistent:
    the empirical histogram (and the peaks stage's margin) answers."""
    per_day = windows_per_day(history)
    rejected = None
    for quantile in (policy.tail_threshold_quantile,
                     *(q for q in _HIGHER_THRESHOLDS if q > policy.tail_threshold_quantile)):
        model = fit_tail(history.usage, per_day, history.sample_count, quantile, policy.tail_min_exceedances)
        if model.fit is None:
            return rejected or model
        if expected_above_largest(model) <= _MAX_EXPECTED_ABOVE_LARGEST:
            return model
        rejected = replace(model, fit=None, bootstrap=(), rejected_fit=model.fit)
    return rejected


def smallest_cap_meeting(model: TailModel, target_per_day: float, start: int, alignment: int, max_cap: int) -> int:
    """Smallest multiple of ``alignment`` from ``start`` whose predicted risk (the band's high end)
    is at most the target; ``max_cap`` if none is. Risk falls with the cap: a binary search."""
    low, high = max(1, -(-start // alignment)), max(1, max_cap // alignment)
    if model.band(high * alignment)[1] > target_per_day:
        return high * alignment
    while low < high:
        middle = (low + high) // 2
        if model.band(middle * alignment)[1] <= target_per_day:
            high = middle
        else:
            low = middle + 1
    return low * alignment


def size_for_risk(given: Evidence, sized: float) -> Step[float]:
    """With a tail fit, the smallest aligned cap at or above every remembered sample (overflow bumps
    included) whose predicted overflowing windows per day meet the target: the risk replaces the
    fixed margin. Without one, the peaks stage's margin (``sized``) stands."""
    model, policy = given.tail, given.policy
    target = policy.target_overflow_windows_per_day
    if model.fit is None:
        return Step(sized, (model.describe() + "; the margin above the largest sample stands",))
    remembered = given.history.estimator_histogram().percentile(1.0)
    start = max(remembered * (1.0 + policy.risk_min_margin), policy.min_cap)
    cap = smallest_cap_meeting(model, target, int(math.ceil(start)), policy.alignment, policy.max_cap)
    low, high = model.band(cap)
    return Step(cap, (
        f"{model.describe()}; {cap} is the smallest aligned cap at least {policy.risk_min_margin:.0%} above the "
        f"remembered peaks ({remembered}) whose predicted overflows, {model.overflow_windows_per_day(cap):.3g} windows per day "
        f"(band {low:.2g}..{high:.2g}), meet the target of {target:.3g} per day "
        f"(one in {1 / target:.0f} days)",))
