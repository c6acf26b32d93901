"""The advisor's sample: the EP GROUP's peak R per time window.

The cap is one number shared by every rank and a dispatch fails as soon as any rank's R
exceeds it, so the quantity to size for is, per window, the max over ranks of each rank's
interval peak — not a per-rank average. Ranks report on their own clocks; their intervals are
aligned by the window their interval END falls in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankInterval:
    ep_rank: int
    end_unix_s: float
    peak_runtime_tokens: int
    cap: int
    overflow_events: int = 0  # runtime_over_cap events in the interval


@dataclass
class GroupSample:
    window_start_s: float
    peak_runtime_tokens: int
    cap: int
    overflow_events: int = 0
    ranks: set[int] = field(default_factory=set)

    @property
    def overflowed(self) -> bool:
        return self.overflow_events > 0 or self.peak_runtime_tokens > self.cap


def window_start(end_unix_s: float, window_s: float) -> float:
    return (end_unix_s // window_s) * window_s


def group_samples(intervals: Iterable[RankInterval], window_s: float) -> list[GroupSample]:
    """One sample per window: the hottest rank's peak, the largest cap, all overflow events."""
    samples: dict[float, GroupSample] = {}
    for interval in intervals:
        start = window_start(interval.end_unix_s, window_s)
        sample = samples.get(start)
        if sample is None:
            samples[start] = GroupSample(start, interval.peak_runtime_tokens, interval.cap,
                                         interval.overflow_events, {interval.ep_rank})
            continue
        sample.peak_runtime_tokens = max(sample.peak_runtime_tokens, interval.peak_runtime_tokens)
        sample.cap = max(sample.cap, interval.cap)
        sample.overflow_events += interval.overflow_events
        sample.ranks.add(interval.ep_rank)
    return [samples[start] for start in sorted(samples)]
