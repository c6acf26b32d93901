"""A decaying histogram of token counts (the VPA recommender's memory model, fitted to tokens).

Buckets are log-linear (HDR-histogram style): exact token bins up to 128, then 32 equal
sub-buckets per power of two (at most 3.1 % wide). Every multiple of 128 up to 8192 ends a
bucket, so a cap never splits a bucket and "how often would this cap overflow" is exact
for the caps people actually set. ``percentile`` returns the END of the bucket that reaches
the requested share, so it rounds up, never down — an under-estimate crashes the dispatch.

A sample at time t weighs ``2 ** ((t - reference_s) / half_life_s)``; when the exponent grows
past 100 the reference moves and every weight is rescaled (as VPA does), so weights stay finite.
Relative weights, and so every percentile, do not depend on the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EXACT_LIMIT = 128
SUB_BUCKET_BITS = 5  # 32 sub-buckets per power of two
_MAX_EXPONENT = 100.0


def bucket_index(tokens: int) -> int:
    if tokens <= EXACT_LIMIT:
        return max(0, tokens)
    # Buckets are (start, end]: shifting by one puts every multiple of the sub-bucket width
    # on a bucket's END, so "R <= cap" is a whole number of buckets.
    shifted = tokens - 1
    power = shifted.bit_length() - 1
    width = 1 << (power - SUB_BUCKET_BITS)
    return EXACT_LIMIT + 1 + ((power - 7) << SUB_BUCKET_BITS) + (shifted - (1 << power)) // width


def bucket_range(index: int) -> tuple[int, int]:
    """Inclusive [first, last] token counts of a bucket."""
    if index <= EXACT_LIMIT:
        return index, index
    offset = index - EXACT_LIMIT - 1
    power = 7 + (offset >> SUB_BUCKET_BITS)
    width = 1 << (power - SUB_BUCKET_BITS)
    first = (1 << power) + (offset & ((1 << SUB_BUCKET_BITS) - 1)) * width + 1
    return first, first + width - 1


@dataclass
class DecayingHistogram:
    half_life_s: float
    reference_s: float = 0.0
    weights: dict[int, float] = field(default_factory=dict)

    def add(self, tokens: int, time_s: float, weight: float = 1.0) -> None:
        if not self.weights:
            self.reference_s = time_s  # weights near 1: no overflow whatever the epoch
        exponent = (time_s - self.reference_s) / self.half_life_s
        if exponent > _MAX_EXPONENT:
            self._shift_reference(time_s)
            exponent = 0.0
        index = bucket_index(tokens)
        self.weights[index] = self.weights.get(index, 0.0) + weight * 2.0 ** exponent

    def _shift_reference(self, new_reference_s: float) -> None:
        scale = 2.0 ** ((self.reference_s - new_reference_s) / self.half_life_s)
        self.weights = {index: weight * scale for index, weight in self.weights.items() if weight * scale > 0.0}
        self.reference_s = new_reference_s

    def merge(self, other: "DecayingHistogram") -> None:
        if other.half_life_s != self.half_life_s:
            raise ValueError("cannot merge histograms with different half-lives")
        if not other.weights:
            return
        if not self.weights:
            self.reference_s = other.reference_s
        if (other.reference_s - self.reference_s) / self.half_life_s > _MAX_EXPONENT:
            self._shift_reference(other.reference_s)
        scale = 2.0 ** ((other.reference_s - self.reference_s) / self.half_life_s)
        for index, weight in other.weights.items():
            self.weights[index] = self.weights.get(index, 0.0) + weight * scale

    def copy(self) -> "DecayingHistogram":
        return DecayingHistogram(self.half_life_s, self.reference_s, dict(self.weights))

    @property
    def total_weight(self) -> float:
        return sum(self.weights.values())

    def is_empty(self) -> bool:
        return not self.weights

    def percentile(self, share: float) -> int:
        """Smallest bucket end with at least ``share`` of the weight at or below it."""
        if not self.weights:
            raise ValueError("percentile of an empty histogram")
        threshold = min(max(share, 0.0), 1.0) * self.total_weight
        cumulative = 0.0
        indices = sorted(self.weights)
        for index in indices:
            cumulative += self.weights[index]
            # relative tolerance: a sum of floats may fall a hair short of the total
            if cumulative >= threshold * (1.0 - 1e-12):
                return bucket_range(index)[1]
        return bucket_range(indices[-1])[1]

    def share_above(self, tokens: int) -> float:
        """Weighted share of samples above ``tokens`` (a bucket split by it counts pro rata)."""
        total = self.total_weight
        if total <= 0.0:
            return 0.0
        above = 0.0
        for index, weight in self.weights.items():
            first, last = bucket_range(index)
            if first > tokens:
                above += weight
            elif last > tokens:
                above += weight * (last - tokens) / (last - first + 1)
        return above / total

    def forget_below(self, relative_weight: float, now_s: float) -> None:
        """Drop buckets weighing less than ``relative_weight`` of one fresh sample at ``now_s``."""
        if not self.weights or relative_weight <= 0.0:
            return
        # in log2 space: a fresh sample's weight 2 ** ((now - reference) / half_life) may not fit a float
        threshold = math.log2(relative_weight) + (now_s - self.reference_s) / self.half_life_s
        self.weights = {index: weight for index, weight in self.weights.items()
                        if weight > 0.0 and math.log2(weight) >= threshold}

    def to_dict(self) -> dict:
        return {
            "half_life_s": self.half_life_s,
            "reference_s": self.reference_s,
            "weights": [[index, weight] for index, weight in sorted(self.weights.items())],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "DecayingHistogram":
        weights = {int(index): float(weight) for index, weight in data["weights"] if math.isfinite(weight)}
        return cls(float(data["half_life_s"]), float(data["reference_s"]), weights)
