"""Everything the advisor knows about one EP group's past: decaying histograms of the group
samples (and of the overflow bumps, kept apart so predicted overflow rates come from real
samples only) plus counts and the span of history. Built from raw windows, folded into the
store when windows age out, and rebuilt identically after a restart."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from capwatch.advisor.histogram import DecayingHistogram
from capwatch.advisor.sample import GroupSample

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0
DAYS_KEPT = 60  # daily peaks remembered for the trend stage
HOURS_KEPT = 14 * 24  # hourly peaks remembered for the short-history trend (the same hour across days)


def overflow_bump(peak_runtime_tokens: int, cap: int, factor: float = 1.2, min_tokens: int = 16) -> int:
    """Overflow events are evidence that the need was ABOVE what was observed. Like VPA's OOM bump,
    an overflowing window adds one extra sample at ``max(used * factor, used + min_tokens)`` with
    ``used = max(cap, observed peak)``: computed from what was used, never from an earlier bump,
    so bumps do not compound."""
    used = max(cap, peak_runtime_tokens)
    return max(int(-(-used * factor // 1)), used + min_tokens)


@dataclass
class SampleHistory:
    half_life_s: float
    usage: DecayingHistogram = None  # type: ignore[assignment]
    bumps: DecayingHistogram = None  # type: ignore[assignment]
    sample_count: int = 0
    overflow_windows: int = 0
    first_sample_s: float | None = None
    last_sample_s: float | None = None
    max_peak_runtime_tokens: int = 0
    window_s: float = 60.0
    caps_seen: set[int] = field(default_factory=set)
    # UTC day -> [largest window peak, windows seen]: the trend stage's series (the histograms keep no time).
    daily: dict[int, list[int]] = field(default_factory=dict)
    # UTC hour (since the epoch) -> [largest window peak, windows seen]: the trend over a short history.
    hourly: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.usage is None:
            self.usage = DecayingHistogram(self.half_life_s)
        if self.bumps is None:
            self.bumps = DecayingHistogram(self.half_life_s)

    @property
    def history_s(self) -> float:
        if self.first_sample_s is None or self.last_sample_s is None:
            return 0.0
        return self.last_sample_s - self.first_sample_s + self.window_s

    @property
    def covered_s(self) -> float:
        """Time the samples actually cover. Gaps and a rank whose clock is far off stretch
        ``history_s`` but not this, so the advisor's history gates use it (VPA: min(days, samples/day))."""
        return min(self.history_s, self.sample_count * self.window_s)

    def add(self, sample: GroupSample, bump_factor: float, bump_min_tokens: int) -> None:
        """One window; an overflowing one also bumps (``overflow_bump``: the policy's factor and least step)."""
        self.usage.add(sample.peak_runtime_tokens, sample.window_start_s)
        if sample.overflowed:
            self.overflow_windows += 1
            self.bumps.add(overflow_bump(sample.peak_runtime_tokens, sample.cap, bump_factor, bump_min_tokens),
                           sample.window_start_s)
        self.sample_count += 1
        self.max_peak_runtime_tokens = max(self.max_peak_runtime_tokens, sample.peak_runtime_tokens)
        self.caps_seen.add(sample.cap)
        start, peak = sample.window_start_s, sample.peak_runtime_tokens
        _fold_period(self.daily, int(start // SECONDS_PER_DAY), peak, 1, DAYS_KEPT)
        _fold_period(self.hourly, int(start // SECONDS_PER_HOUR), peak, 1, HOURS_KEPT)
        self.first_sample_s = start if self.first_sample_s is None else min(self.first_sample_s, start)
        self.last_sample_s = start if self.last_sample_s is None else max(self.last_sample_s, start)

    def add_all(self, samples: Iterable[GroupSample], bump_factor: float, bump_min_tokens: int) -> "SampleHistory":
        for sample in samples:
            self.add(sample, bump_factor, bump_min_tokens)
        return self

    def merged(self, other: "SampleHistory") -> "SampleHistory":
        result = self.copy()
        result.usage.merge(other.usage)
        result.bumps.merge(other.bumps)
        result.sample_count += other.sample_count
        result.overflow_windows += other.overflow_windows
        result.max_peak_runtime_tokens = max(result.max_peak_runtime_tokens, other.max_peak_runtime_tokens)
        result.caps_seen |= other.caps_seen
        for periods, theirs, kept in ((result.daily, other.daily, DAYS_KEPT),
                                      (result.hourly, other.hourly, HOURS_KEPT)):
            for period, (peak, windows) in theirs.items():
                _fold_period(periods, period, peak, windows, None)
            for period in sorted(periods)[:-kept]:
                del periods[period]
        firsts = [s for s in (self.first_sample_s, other.first_sample_s) if s is not None]
        lasts = [s for s in (self.last_sample_s, other.last_sample_s) if s is not None]
        result.first_sample_s = min(firsts) if firsts else None
        result.last_sample_s = max(lasts) if lasts else None
        return result

    def copy(self) -> "SampleHistory":
        return SampleHistory(
            self.half_life_s, self.usage.copy(), self.bumps.copy(), self.sample_count, self.overflow_windows,
            self.first_sample_s, self.last_sample_s, self.max_peak_runtime_tokens, self.window_s, set(self.caps_seen),
            {day: list(value) for day, value in self.daily.items()},
            {hour: list(value) for hour, value in self.hourly.items()},
        )

    def estimator_histogram(self) -> DecayingHistogram:
        combined = self.usage.copy()
        combined.merge(self.bumps)
        return combined

    def forget_below(self, relative_weight: float, now_s: float) -> None:
        self.usage.forget_below(relative_weight, now_s)
        self.bumps.forget_below(relative_weight, now_s)

    def to_dict(self) -> dict:
        return {
            "half_life_s": self.half_life_s, "usage": self.usage.to_dict(), "bumps": self.bumps.to_dict(),
            "sample_count": self.sample_count, "overflow_windows": self.overflow_windows,
            "first_sample_s": self.first_sample_s, "last_sample_s": self.last_sample_s,
            "max_peak_runtime_tokens": self.max_peak_runtime_tokens, "window_s": self.window_s,
            "caps_seen": sorted(self.caps_seen),
            "daily": [[day, peak, windows] for day, (peak, windows) in sorted(self.daily.items())],
            "hourly": [[hour, peak, windows] for hour, (peak, windows) in sorted(self.hourly.items())],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "SampleHistory":
        return cls(
            float(data["half_life_s"]), DecayingHistogram.from_dict(data["usage"]),
            DecayingHistogram.from_dict(data["bumps"]), int(data["sample_count"]), int(data["overflow_windows"]),
            data["first_sample_s"], data["last_sample_s"], int(data["max_peak_runtime_tokens"]),
            float(data["window_s"]), set(data.get("caps_seen", [])),
            {int(day): [int(peak), int(windows)] for day, peak, windows in data.get("daily", [])},
            {int(hour): [int(peak), int(windows)] for hour, peak, windows in data.get("hourly", [])},
        )

    def daily_peaks(self, min_coverage: float) -> list[tuple[int, int]]:
        """(UTC day number, largest window peak) of each day with at least ``min_coverage`` of its windows
        seen, oldest first (a partial day's peak would read as a decline). The day numbers keep the time
        axis true across days left out."""
        full = SECONDS_PER_DAY / self.window_s
        return [(day, peak) for day, (peak, windows) in sorted(self.daily.items()) if windows >= min_coverage * full]

    def hourly_peaks(self, min_coverage: float) -> list[tuple[int, int]]:
        """(UTC hour number, largest window peak) of each hour with at least ``min_coverage`` of its windows
        seen, oldest first; none when a window is longer than an hour."""
        full = SECONDS_PER_HOUR / self.window_s
        if full < 1:
            return []
        return [(hour, peak) for hour, (peak, windows) in sorted(self.hourly.items()) if windows >= min_coverage * full]


def _fold_period(periods: dict[int, list[int]], period: int, peak: int, windows: int, kept: int | None) -> None:
    """One more [peak, windows] into a period's; past ``kept`` periods the oldest is let go."""
    mine = periods.setdefault(period, [0, 0])
    mine[0], mine[1] = max(mine[0], peak), mine[1] + windows
    if kept is not None and len(periods) > kept:
        del periods[min(periods)]
