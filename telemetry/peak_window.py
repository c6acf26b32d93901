"""The largest R over a trailing window of time, exact whatever the scrape cadence.

A gauge holding "the peak of the last reporting interval" is sampled, not summed: Prometheus
scraping every 15 s sees one 5 s interval in three, and a peak in the other two is never seen.
Instead, every scrape (the only caller; the dispatch never gets here) takes a counter snapshot
and computes the largest R since the previous scrape from the R histogram's delta, so no step
falls between two scrapes. Those per-scrape peaks go into a ring of time slots; the gauge is
their max over the trailing ``window_s``. With ``window_s`` at least the scrape interval, every
scraper (two of an HA pair too, each cutting the other's segments) sees every peak; the default
60 s covers a 15-30 s scrape interval with room to spare.

A peak is filed under the time of the scrape that found it, which may be up to one scrape
interval after the step, and a slot is kept while any part of it is in the window: a peak
stays visible for at least ``window_s`` and at most ``window_s`` + one slot.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable

from capwatch.dispatcher.counters import CounterSnapshot
from capwatch.telemetry.intervals import interval_peak, peak_from_top_bin

DEFAULT_PEAK_WINDOW_S = 60.0
PEAK_WINDOW_SLOTS = 12  # memory is bounded by this, however often scrapes come


def peak_between(previous: CounterSnapshot, current: CounterSnapshot) -> int:
    """Largest R of the steps between two coherent snapshots, by ``interval_peak``'s rule (never below the
    local batch of the same steps). Scans down from the top bin and stops at the first that grew: a scrape
    does not walk the whole histogram for it."""
    before, now = previous.runtime_tokens_histogram, current.runtime_tokens_histogram
    grown = () if current.forward_steps == previous.forward_steps else (
        next(r for r in range(len(now) - 1, -1, -1) if now[r] > before[r]),)
    return interval_peak(previous, current, [(top_bin, now[top_bin] - before[top_bin]) for top_bin in grown],
                         local_peak_between(previous, current))


def local_peak_between(previous: CounterSnapshot, current: CounterSnapshot) -> int:
    """This rank's own largest local batch between two coherent snapshots, scanned the same way
    (0 when the steps were recorded without their local batch)."""
    now = current.local_tokens_histogram
    before = previous.local_tokens_histogram or (0,) * len(now)
    top_bin = next((bin_ for bin_ in range(len(now) - 1, -1, -1) if now[bin_] > before[bin_]), 0)
    return peak_from_top_bin(top_bin, previous.max_local_tokens, current.max_local_tokens) if top_bin else 0


PeakBetween = Callable[[CounterSnapshot, CounterSnapshot], int]


class TrailingPeak:
    """Fed coherent snapshots of one rank's counters with a monotonic time; answers the largest
    R (or what ``between`` measures, e.g. :func:`local_peak_between`) over the trailing window
    (0 when no step ran in it)."""

    def __init__(self, baseline: CounterSnapshot, window_s: float = DEFAULT_PEAK_WINDOW_S,
                 slots: int = PEAK_WINDOW_SLOTS, between: PeakBetween = peak_between):
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"peak window must be a positive number of seconds, got {window_s}")
        if slots < 1:
            raise ValueError(f"peak window slots must be >= 1, got {slots}")
        self.window_s = window_s
        self._between = between
        self._slot_s = window_s / slots
        self._slots = slots
        self._previous = baseline
        self._peaks: deque[list[int]] = deque()  # [slot index, largest R found in it], oldest first
        self._lock = threading.Lock()  # two scrapers may collect at once

    def observe(self, snapshot: CounterSnapshot, now: float) -> int:
        """File the largest R since the previous snapshot; returns the window's peak at ``now``."""
        with self._lock:
            if snapshot.forward_steps >= self._previous.forward_steps:  # a stale snapshot adds nothing
                peak = self._between(self._previous, snapshot)
                self._previous = snapshot
                slot = self._slot(now)
                if self._peaks and self._peaks[-1][0] == slot:
                    self._peaks[-1][1] = max(self._peaks[-1][1], peak)
                elif peak:
                    self._peaks.append([slot, peak])
            return self._peak_locked(now)

    def peak(self, now: float) -> int:
        with self._lock:
            return self._peak_locked(now)

    def _slot(self, now: float) -> int:
        return math.floor(now / self._slot_s)

    def _peak_locked(self, now: float) -> int:
        oldest = self._slot(now) - self._slots  # the slot holding now - window_s, still partly inside
        while self._peaks and self._peaks[0][0] < oldest:
            self._peaks.popleft()
        return max((peak for _, peak in self._peaks), default=0)
