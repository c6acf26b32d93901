"""From two counter snapshots to one reporting interval: small pure pieces and one tracker.

A snapshot is taken while the dispatch keeps running, so its tensors are copied one after the
other and can disagree by a step in flight (``forward_steps`` copied before that step, the R
histogram after it). ``coherent`` settles that by trusting the histogram, which is what both
the interval and the Prometheus histogram are built from; every counter only grows, so a later
snapshot is never below an earlier one and every delta is non-negative.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from itertools import accumulate

from capwatch.dispatcher.counters import CounterSnapshot, DispatchCounters
from capwatch.telemetry.report import CumulativeCounters, Interval, OverflowCount

from capwatch.vocabulary import OVERFLOW_KINDS, OVERFLOW_OUTCOMES


def zero_snapshot(cap: int, ep_size: int, role: str, taken_at: float) -> CounterSnapshot:
    """The counters of a rank that has not dispatched yet: the baseline of its first interval."""
    return CounterSnapshot(
        cap=cap, ep_size=ep_size, role=role, taken_at=taken_at,
        dispatch_calls=0, forward_steps=0, tokens_sent=0, tokens_received=0, max_runtime_tokens=0,
        chunked_rounds=0,
        overflow_events={(kind, outcome): 0 for kind in OVERFLOW_KINDS for outcome in OVERFLOW_OUTCOMES},
        runtime_tokens_histogram=(0,) * (cap + 2),
        tokens_sent_per_rank=(0,) * ep_size,
        tokens_received_per_rank=(0,) * ep_size,
        local_tokens_histogram=(0,) * (cap + 2),
    )


def coherent(snapshot: CounterSnapshot) -> CounterSnapshot:
    """The snapshot with forward_steps and the maxes made consistent with its histograms, and max R
    never below this rank's largest local batch: R is the group's largest local batch, this rank's
    included (a snapshot can land after a step's local max and before its R max; a step recorded with
    a local batch above its R, which the guard then raises, still says R was at least that batch)."""
    max_local_tokens = max(snapshot.max_local_tokens, _top_bin(snapshot.local_tokens_histogram))
    return dataclasses.replace(
        snapshot,
        forward_steps=sum(snapshot.runtime_tokens_histogram),
        max_runtime_tokens=max(snapshot.max_runtime_tokens, _top_bin(snapshot.runtime_tokens_histogram),
                               max_local_tokens),
        max_local_tokens=max_local_tokens,
    )


def _top_bin(histogram: tuple[int, ...]) -> int:
    return max((tokens for tokens, steps in enumerate(histogram) if steps), default=0)


def histogram_delta(previous: CounterSnapshot, current: CounterSnapshot) -> list[tuple[int, int]]:
    """Sparse ``[(R, steps), ...]`` of the steps between two snapshots, R ascending."""
    return [
        (runtime_tokens, now - before)
        for runtime_tokens, (before, now) in enumerate(
            zip(previous.runtime_tokens_histogram, current.runtime_tokens_histogram, strict=True))
        if now > before
    ]


def interval_peak(previous: CounterSnapshot, current: CounterSnapshot, delta: list[tuple[int, int]],
                  max_local_tokens: int | None) -> int:
    """Largest R of the interval. Above the cap the histogram keeps one bin (cap + 1); the exact R
    is known when the interval raised the running max, otherwise cap + 1 is the honest floor.
    A step updates its histogram bin and the running max in two ops, so a snapshot taken between
    them sees one without the other: whenever the max grew, the step that set it has run, and its
    exact R counts here even if its histogram bin landed in the previous interval.
    Never below ``max_local_tokens``, the interval's own largest local batch (its R is at least that):
    the local batch's running max can grow in an interval where R's did not, and the floor cap + 1
    would then contradict it."""
    top_bin = delta[-1][0] if delta else 0
    return max(peak_from_top_bin(top_bin, previous.max_runtime_tokens, current.max_runtime_tokens),
               max_local_tokens or 0)


def peak_from_top_bin(top_bin: int, previous_max: int, current_max: int) -> int:
    """``interval_peak``'s rule for any binned quantity with a running max (R, the local batch)."""
    return max(top_bin, current_max) if current_max > previous_max else top_bin


def interval_max_local_tokens(previous: CounterSnapshot, current: CounterSnapshot) -> int | None:
    """This rank's own largest local batch in the interval, by ``interval_peak``'s rule; 0 without
    steps, None when the interval's steps were recorded without their local batch. A step's local bin
    and its running max can land one snapshot after its R bin: they count in the interval they landed in."""
    before = previous.local_tokens_histogram or (0,) * len(current.local_tokens_histogram)
    grown = [tokens for tokens, (then, now) in enumerate(zip(before, current.local_tokens_histogram, strict=True))
             if now > then]
    if not grown and current.max_local_tokens == previous.max_local_tokens:
        return 0 if current.forward_steps == previous.forward_steps else None
    return peak_from_top_bin(grown[-1] if grown else 0, previous.max_local_tokens, current.max_local_tokens)


def overflow_counts(events: dict[tuple[str, str], int]) -> list[OverflowCount]:
    return [OverflowCount(kind=kind, outcome=outcome, count=count) for (kind, outcome), count in events.items() if count]


def interval_between(previous: CounterSnapshot, current: CounterSnapshot) -> Interval:
    """What happened between two coherent snapshots of the same counters."""
    delta = histogram_delta(previous, current)
    max_local_tokens = interval_max_local_tokens(previous, current)
    return Interval(
        start_unix_s=previous.taken_at,
        end_unix_s=max(current.taken_at, previous.taken_at),
        forward_steps=current.forward_steps - previous.forward_steps,
        dispatch_calls=current.dispatch_calls - previous.dispatch_calls,
        peak_runtime_tokens=interval_peak(previous, current, delta, max_local_tokens),
        max_local_tokens=max_local_tokens,
        runtime_tokens_histogram=delta,
        overflow_events=overflow_counts({
            key: current.overflow_events[key] - previous.overflow_events[key] for key in current.overflow_events
        }),
    )


def cumulative_counters(snapshot: CounterSnapshot) -> CumulativeCounters:
    return CumulativeCounters(
        dispatch_calls=snapshot.dispatch_calls,
        forward_steps=snapshot.forward_steps,
        tokens_sent=snapshot.tokens_sent,
        tokens_received=snapshot.tokens_received,
        max_runtime_tokens=snapshot.max_runtime_tokens,
        overflow_events=overflow_counts(snapshot.overflow_events),
    )


def merge_intervals(earlier: Interval, later: Interval) -> Interval:
    """One interval covering two adjacent ones; nothing is lost but time resolution."""
    steps: dict[int, int] = dict(earlier.runtime_tokens_histogram)
    for runtime_tokens, count in later.runtime_tokens_histogram:
        steps[runtime_tokens] = steps.get(runtime_tokens, 0) + count
    overflows: dict[tuple[str, str], int] = {}
    for event in (*earlier.overflow_events, *later.overflow_events):
        overflows[(event.kind, event.outcome)] = overflows.get((event.kind, event.outcome), 0) + event.count
    return Interval(
        start_unix_s=earlier.start_unix_s,
        end_unix_s=later.end_unix_s,
        forward_steps=earlier.forward_steps + later.forward_steps,
        dispatch_calls=earlier.dispatch_calls + later.dispatch_calls,
        peak_runtime_tokens=max(earlier.peak_runtime_tokens, later.peak_runtime_tokens),
        max_local_tokens=_max_known(earlier.max_local_tokens, later.max_local_tokens),
        runtime_tokens_histogram=sorted(steps.items()),
        overflow_events=overflow_counts(overflows),
    )


def _max_known(*values: int | None) -> int | None:
    known = [value for value in values if value is not None]
    return max(known) if known else None


def cumulative_buckets(snapshot: CounterSnapshot, bounds: tuple[float, ...]) -> tuple[list[int], int]:
    """Steps with R <= each bound, and the exact sum of R (counted on the device, over-cap steps included).

    The counters keep R per token up to the cap and one bin above it (with the largest R). A bound at or above
    that largest R holds every step; a bound between the cap and it holds the steps up to the cap, the steps
    above it counting from the largest R's bound on: exact for no or one over-cap step (an overflow usually ends
    the rank), never an over-count."""
    histogram = snapshot.runtime_tokens_histogram
    running = list(accumulate(histogram))
    cap = len(histogram) - 2
    top = snapshot.max_runtime_tokens
    counts = [running[int(bound)] if bound <= cap else running[-1] if bound >= top else running[cap]
              for bound in bounds]
    return counts, snapshot.runtime_tokens_sum


class IntervalTracker:
    """Cuts one rank's counters into consecutive intervals. The reporter closes an interval every
    ``interval_s``; the exporter reads the last closed one (and closes them itself when no reporter runs).

    ``clock`` dates the intervals' bounds: by default the wall clock at which each snapshot was taken; a
    replay passes the clock of what it replays (the demo's steps), so an interval is dated by the steps
    it holds, however fast the machine runs them."""

    def __init__(self, counters: DispatchCounters, clock: Callable[[], float] | None = None):
        self._counters = counters
        self._clock = clock
        self._lock = threading.Lock()
        self._previous = zero_snapshot(counters.cap, counters.ep_size, counters.role, self._now())
        self._last_interval: Interval | None = None

    def _now(self) -> float:
        return time.time() if self._clock is None else self._clock()

    @property
    def last_interval(self) -> Interval | None:
        return self._last_interval

    def snapshot(self) -> CounterSnapshot:
        snapshot = self._counters.snapshot()
        if self._clock is not None:
            snapshot = dataclasses.replace(snapshot, taken_at=self._clock())
        return coherent(snapshot)

    def close(self) -> tuple[Interval, CounterSnapshot]:
        """End the current interval now; returns it with the snapshot that ends it."""
        with self._lock:
            return self._close_locked()

    def close_if_due(self, interval_s: float) -> None:
        with self._lock:
            if self._now() - self._previous.taken_at >= interval_s:
                self._close_locked()

    def _close_locked(self) -> tuple[Interval, CounterSnapshot]:
        current = self.snapshot()
        interval = interval_between(self._previous, current)
        self._previous = current
        self._last_interval = interval
        return interval, current
