"""The advisor's sample, the EP GROUP's peak R per time window, and the one definition of the window rule.

The cap is one number shared by every rank and a dispatch fails as soon as any rank's R
exceeds it, so the quantity to size for is, per window, the max over ranks of each rank's
interval peak — not a per-rank average. Ranks report on their own clocks; their intervals are
aligned by the window their interval END falls in.

The window rule: an interval that ran no forward step says nothing about the need and adds nothing;
the others of one window combine field by field as ``WINDOW_FIELDS`` says (the largest peak, the
largest cap, the overflow events summed). ``group_samples`` applies it in Python (the service, and the log
reader's timeline, ``sglang_logs/timeline.py``, per window); the store's SQL (``store/schema.py:
upsert_windows_sql``) and the Prometheus source's PromQL (``sources/prometheus/windows.py``) are derived from
``WINDOW_FIELDS``, and ``tests/service/test_window_rule.py`` runs the same table of cases through all four.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal, NamedTuple

from capwatch.telemetry.report import MAX_STORED_COUNT

# How two intervals of one window combine a field: the larger value, or the sum (saturating at
# MAX_STORED_COUNT, so a stored window never leaves SQLite's int64).
Combine = Literal["max", "sum"]
SUM_LIMIT = MAX_STORED_COUNT


@dataclass(frozen=True)
class WindowField:
    name: str  # the attribute of RankInterval and GroupSample, and the column of the store's windows table
    combine: Combine


WINDOW_FIELDS: tuple[WindowField, ...] = (
    WindowField("peak_runtime_tokens", "max"),  # the hottest rank's peak: the group's R
    WindowField("cap", "max"),
    WindowField("overflow_events", "sum"),  # runtime_over_cap events of every rank
)


def combined(combine: Combine, first: int, second: int) -> int:
    return max(first, second) if combine == "max" else min(first + second, SUM_LIMIT)


def ran_steps(forward_steps: int) -> bool:
    """Whether an interval counts in its window: one without a forward step is idle (its peak, cap and
    overflows, whatever they say, are not evidence of the need)."""
    return forward_steps > 0


class RankInterval(NamedTuple):  # a tuple: built once per report on the ingest path
    ep_rank: int
    end_unix_s: float
    peak_runtime_tokens: int
    cap: int
    overflow_events: int = 0  # runtime_over_cap events in the interval
    forward_steps: int = 1


# An interval's (or a sample's) WINDOW_FIELDS values, in their order.
window_values = attrgetter(*(rule.name for rule in WINDOW_FIELDS))


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


def sample_of(window_start_s: float, values: Iterable[int], ranks: set[int] | None = None) -> GroupSample:
    """A window's sample from its WINDOW_FIELDS values, in their order (a stored row, a query's answer)."""
    return GroupSample(window_start_s, **dict(zip((rule.name for rule in WINDOW_FIELDS), values)),
                       ranks=set() if ranks is None else ranks)


DEFAULT_WINDOW_S = 60.0  # one group sample per minute: the service's CAPWATCH_WINDOW_S and the log reader's default


def window_start(end_unix_s: float, window_s: float) -> float:
    return (end_unix_s // window_s) * window_s


def group_samples(intervals: Iterable[RankInterval], window_s: float) -> list[GroupSample]:
    """One sample per window in which some interval ran steps, by the window rule, oldest first."""
    samples: dict[float, GroupSample] = {}
    for interval in intervals:
        if not ran_steps(interval.forward_steps):
            continue
        start = window_start(interval.end_unix_s, window_s)
        sample = samples.get(start)
        if sample is None:
            samples[start] = sample_of(start, window_values(interval), {interval.ep_rank})
            continue
        for rule, value in zip(WINDOW_FIELDS, window_values(interval)):
            setattr(sample, rule.name, combined(rule.combine, getattr(sample, rule.name), value))
        sample.ranks.add(interval.ep_rank)
    return [samples[start] for start in sorted(samples)]
