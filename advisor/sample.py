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

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, NamedTuple

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


def window_sample(window_start_s: float, intervals: list) -> GroupSample:
    """The window rule over one window's intervals that ran steps, in their order: each WINDOW_FIELDS value
    combined as its rule says, and the ranks seen. ``intervals``: anything with ``ep_rank`` and the fields (a
    ``RankInterval``, the history's rows)."""
    columns = zip(*map(window_values, intervals))
    values = [max(column) if rule.combine == "max" else functools.reduce(functools.partial(combined, "sum"), column)
              for rule, column in zip(WINDOW_FIELDS, columns)]
    return sample_of(window_start_s, values, {interval.ep_rank for interval in intervals})


def group_samples(intervals: Iterable[RankInterval], window_s: float) -> list[GroupSample]:
    """One sample per window in which some interval ran steps, by the window rule, oldest first."""
    windows: dict[float, list[RankInterval]] = {}
    for interval in intervals:
        if ran_steps(interval.forward_steps):
            windows.setdefault(window_start(interval.end_unix_s, window_s), []).append(interval)
    return [window_sample(start, windows[start]) for start in sorted(windows)]


def samples_in_time_order(intervals: Iterable, window_s: float,
                          end: Callable[[Any], float] = attrgetter("end_unix_s")) -> Iterator[GroupSample]:
    """``group_samples`` of intervals given in time order (``end`` reads an interval's end), each window's sample
    yielded as soon as an interval of a later window comes: a stream of rows holds one window's, not all."""
    window, pending = None, []
    for interval in intervals:
        if not ran_steps(interval.forward_steps):
            continue
        start = window_start(end(interval), window_s)
        if start != window:
            if pending:
                yield window_sample(window, pending)
            window, pending = start, []
        pending.append(interval)
    if pending:
        yield window_sample(window, pending)
