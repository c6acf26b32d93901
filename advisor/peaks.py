"""The peaks stage: target and bounds from the remembered window peaks (VPA's percentile estimator, tuned for
a cap that crashes).

target = percentile(target_percentile) of the group samples and overflow bumps, x (1 + margin).
The default percentile is 1.0 — the largest sample still remembered — because one overflow is
a failed dispatch, not a slow one; the decay forgets old bursts instead of averaging them away.
lower = percentile(lower_percentile) x (1 + margin), shrunk while confidence is low;
upper = target x (1 + 1/confidence): with little history the bounds are wide, so the advisor
does not churn a value that needs a restart. confidence = covered time / a full history (1 day).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from capwatch.advisor.history import SampleHistory
from capwatch.advisor.stage import Step, duration

if TYPE_CHECKING:  # evidence.py measures with estimate() below
    from capwatch.advisor.evidence import Evidence


@dataclass(frozen=True)
class Estimate:
    target_tokens: float
    lower_tokens: float
    upper_tokens: float
    confidence: float  # 0..1: share of a full history seen


def confidence(history: SampleHistory, full_history_s: float) -> float:
    return max(0.0, min(1.0, history.covered_s / full_history_s))


def estimate(history: SampleHistory, target_percentile: float, lower_percentile: float,
             safety_margin: float, full_history_s: float) -> Estimate:
    histogram = history.estimator_histogram()
    confidence_ratio = confidence(history, full_history_s)
    guarded = max(confidence_ratio, 1e-3)
    target = histogram.percentile(target_percentile) * (1.0 + safety_margin)
    lower = histogram.percentile(lower_percentile) * (1.0 + safety_margin) * (1.0 + 0.001 / guarded) ** -2
    upper = target * (1.0 + 1.0 / guarded)
    return Estimate(target, min(lower, target), upper, confidence_ratio)


def size_for_peaks(given: Evidence, sized: float) -> Step[float]:
    """The first stage, so ``sized`` is 0: what the remembered peaks (and overflow bumps) ask for. Its bounds
    and confidence (``given.peaks``) are the hysteresis band ``decide`` uses."""
    found, history, policy = given.peaks, given.history, given.policy
    which = ("the largest remembered sample" if policy.target_percentile >= 1
             else f"the p{policy.target_percentile * 100:g} sample")
    reasons = [f"the group's peak R per {history.window_s:.0f} s window reached {history.max_peak_runtime_tokens} "
               f"tokens over {history.sample_count:,} window{'' if history.sample_count == 1 else 's'} "
               f"({duration(history.covered_s)} covered); sizing for "
               f"{which} plus a {policy.safety_margin:.0%} margin gives {found.target_tokens:.0f} tokens"]
    if history.overflow_windows:
        reasons.append(f"{history.overflow_windows:,} window{'' if history.overflow_windows == 1 else 's'} overflowed "
                       "the cap; each adds a sample "
                       f"{policy.bump_factor:g}x above what was used")
    return Step(found.target_tokens, tuple(reasons))
