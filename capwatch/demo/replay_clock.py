"""The clock a demo replays its workload on, so that its advice depends on the workload and never on
how fast the machine runs it.

Every step has a time of its own, from the replay's start: a trace's ``t``, or one step every
``STEP_INTERVAL_S`` for the generated workload and for a trace without ``t``. The rank processes

* date their reports by it: an interval ends at ``origin + the time of its last step``, ``origin``
  being the start rounded down to a whole service window, the same for every rank;
* cut their reports by it: one per ``REPORT_INTERVAL_S`` of replay time that holds steps (the
  reporter's own wall-clock timer is off);
* pace themselves by it: no step runs before its time on the wall clock. A slow or loaded machine
  falls behind, and the dates stay.

So the service gets the same steps in the same windows and gives the same advice on any machine,
under any load. Times are whole microseconds, so a step on a window's edge falls on the same side
everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capwatch.demo.workload import Workload

STEP_INTERVAL_S = 0.025  # a generated or untimed step (a real decode step takes ~10-50 ms)
REPORT_INTERVAL_S = 0.5  # a report per this much replay time; must divide the service's window
_US = 1_000_000
_REPORT_INTERVAL_US = round(REPORT_INTERVAL_S * _US)


@dataclass(frozen=True)
class ReplayClock:
    """When each step of a replay happens, and so the date of every report the ranks send."""

    origin_unix_s: float  # a whole multiple of the service's window
    step_offsets_us: tuple[int, ...]  # each step's time from the start, non-decreasing
    source: str  # what set the times, for the user

    def offset_s(self, step: int) -> float:
        """Seconds from the start at which ``step`` is due (the pacing)."""
        return self.step_offsets_us[step] / _US

    def date(self, step: int) -> float:
        """The unix time ``step`` happens at, on this clock."""
        return self.origin_unix_s + self.step_offsets_us[step] / _US

    def report_after(self, step: int) -> bool:
        """Whether a report closes after ``step``: the next step falls in a later report period. (The
        last step's report is the final one.)"""
        following = step + 1
        return following < len(self.step_offsets_us) and \
            self.step_offsets_us[following] // _REPORT_INTERVAL_US > self.step_offsets_us[step] // _REPORT_INTERVAL_US

    @property
    def duration_s(self) -> float:
        return self.step_offsets_us[-1] / _US if self.step_offsets_us else 0.0


def replay_origin(now_unix_s: float, window_s: float) -> float:
    """The start rounded down to a whole window: every step then falls in the same window of the service
    whatever second the replay starts in (and no date is ever ahead of the wall clock)."""
    return math.floor(now_unix_s / window_s) * window_s


def replay_clock(workload: Workload, origin_unix_s: float) -> ReplayClock:
    """The trace's ``t`` when it has one; otherwise one step every ``STEP_INTERVAL_S``."""
    if workload.step_times_s is not None:
        offsets = tuple(round(seconds * _US) for seconds in workload.step_times_s)
        return ReplayClock(origin_unix_s, offsets, 'the trace\'s own "t"')
    interval_us = round(STEP_INTERVAL_S * _US)
    why = "the generated workload" if workload.source == "generated" else 'the trace has no "t"'
    return ReplayClock(origin_unix_s, tuple(step * interval_us for step in range(workload.steps)),
                       f"one step every {STEP_INTERVAL_S * 1000:g} ms ({why})")


class ReplayReading:
    """One rank's reading of the replay clock: the date of the step it is at (an ``IntervalTracker``
    clock). The rank moves it; the reporter and exporter threads only read it."""

    def __init__(self, clock: ReplayClock):
        self.clock = clock
        self.unix_s = clock.origin_unix_s

    def at_step(self, step: int) -> None:
        self.unix_s = self.clock.date(step)

    def idle_until(self, unix_s: float) -> None:
        """Between steps, waiting: never back, never past the next step's date."""
        self.unix_s = max(self.unix_s, unix_s)

    def __call__(self) -> float:
        return self.unix_s
