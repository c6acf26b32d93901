"""The records of every file, merged by time -> one timeline: each window's group sample, in the
configuration that was running then, into that configuration's history.

- A window's sample is the largest ``#running-req`` any line of any file showed in it, times the tokens each
  request dispatches per step in its configuration, or an overflow's need if larger (``_Window``), by the
  service's window rule (``advisor/sample.py``: a window of idle lines alone adds nothing).
- A configuration runs from its start-up line's stamp until the next start with other args; a start with
  the same args continues it, in whichever file it was logged (``Segment``). Lines before any start-up
  line belong to the configuration given by flags, if any.
- Records arrive in time order from the streaming merge; a file that goes back in time (lines written out
  of order, a log concatenated out of order) is still placed exactly as long as it goes back less than
  ``REORDER_S``: windows are folded into the history only that far behind the newest one. A line older
  than that cannot be placed: it is counted by day, with the first such line named (``Unplaced``).
- The same line in two files counts once: windows keep each file's line hashes until they are
  ``DEDUPE_WINDOWS`` behind the newest (the merge brings a window's lines from every file together), and
  count each line as often as the file holding it most often.

Memory: the windows of ``REORDER_S`` (a few numbers each), the line hashes of ``DEDUPE_WINDOWS``
windows, and at most ``MAX_CONFIGURATIONS`` histories, whatever the logs' length or number.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from operator import attrgetter, or_

from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.sample import RankInterval, group_samples
from capwatch.sglang_logs.line_shapes import dp_rank
from capwatch.sglang_logs.log_file import (
    ARGS,
    LATE,
    UNCONFIGURED,
    WINDOW,
    ArgsRecord,
    LogRecord,
    OverflowRecord,
    Unplaced,
    WindowRecord,
)
from capwatch.sglang_logs.server_args import ServerConfig
from capwatch.sglang_logs.stamps import SECONDS_PER_DAY

REORDER_S = 2 * SECONDS_PER_DAY
DEDUPE_WINDOWS = 4
CONFIRM_AHEAD = 4  # records within one reorder window of each other that move time on by more than it
MAX_AHEAD = 256
MAX_CONFIGURATIONS = 64


@dataclass
class Segment:
    """One configuration: from a start-up args line (or the flags) until a start with different args."""

    config: ServerConfig
    history: SampleHistory
    # --cap, else the cap the latest overflow assertion showed, else SGLang's default: an assumption (cap_known)
    cap_in_use: int | None
    from_flags: bool = False
    starts: int = 0
    first_start_s: float | None = None  # its first start-up line (-inf: configured by flags)
    decode_lines: int = 0
    overflow_lines: int = 0
    cap_seen: int | None = None  # max_num_tokens of an assertion: the cap that was really in use
    # The largest R that ran without an overflow assertion in its window: every backend asserts on a batch above
    # its cap, so the cap in use was at least this (what bounds a cap the log does not show).
    peak_without_assertion: int = 0
    dp_peak_tokens: dict[int, int] = field(default_factory=dict)  # DP rank -> its largest R
    dp_peak_windows: dict[int, int] = field(default_factory=dict)  # DP rank -> windows whose peak it held
    first_unix_s: float | None = None
    last_unix_s: float | None = None


class _Window:
    __slots__ = ("peak_running", "tags", "counted", "lines", "hashes", "overflow_needed", "overflow_tags",
                 "overflows", "cap_seen", "where")

    def __init__(self, where: str) -> None:
        self.peak_running = 0
        self.tags = ""
        self.counted = 0  # decode lines already counted once across files (hashes let go)
        self.lines: dict[int, int] = {}  # file -> decode lines not yet counted
        self.hashes: dict[int, Counter] | None = None  # file -> their hashes (several files only)
        self.overflow_needed = 0
        self.overflow_tags = ""
        self.overflows: dict[int, Counter] = {}  # file -> (tokens needed, cap, tags) of its assertions
        self.cap_seen = 0
        self.where = where  # the first line read of this window

    def decode_count(self) -> int:
        if self.hashes is not None and len(self.hashes) > 1:
            return self.counted + sum(reduce(or_, self.hashes.values()).values())
        return self.counted + sum(self.lines.values())

    def overflow_count(self) -> int:
        if not self.overflows:
            return 0
        return sum(reduce(or_, self.overflows.values()).values())


@dataclass
class Placement:
    """What the timeline made of the records."""

    segments: list[Segment] = field(default_factory=list)  # in the order they first started
    decode_lines: int = 0  # placed, each line once
    overflow_lines: int = 0
    duplicate_lines: int = 0  # decode and overflow lines already read in another file
    late: Unplaced = field(default_factory=lambda: Unplaced(
        LATE, f"older than lines before it by more than {REORDER_S // 3600} h"))
    unconfigured: Unplaced = field(default_factory=lambda: Unplaced(
        UNCONFIGURED, "before any start-up line (no flags)"))
    late_starts: int = 0  # start-up lines older than the placed windows: ignored
    dropped_configurations: int = 0


class Timeline:
    def __init__(self, window_s: float, policy: AdvisorPolicy, *, cap: int | None,
                 fallback: ServerConfig | None, configure: Callable[[ServerConfig], ServerConfig],
                 names: list[str]) -> None:
        self.window_s = window_s
        self.policy = policy
        self.cap = cap
        self.configure = configure
        self.names = names
        self.placement = Placement()
        self._segments: dict[ServerConfig, Segment] = {}
        self._fallback = self._segment(fallback, from_flags=True) if fallback is not None else None
        self._change_times: list[float] = []  # start-up stamps, in time order ...
        self._change_segments: list[Segment] = []  # ... and the configuration each started
        self._windows: dict[int, _Window] = {}
        self._fold_heap: list[int] = []
        self._dedupe_heap: list[int] = []
        self._head = None  # the newest window index seen
        self._reorder = max(1, int(REORDER_S // window_s))
        self._fold_before = float("-inf")  # windows below this index are in the histories
        self._ahead: list[WindowRecord | OverflowRecord] = []  # records far ahead of the newest, until confirmed

    # -- records -------------------------------------------------------------------------------------------
    def add(self, record: LogRecord) -> None:
        if record.kind == ARGS:
            self._start(record)
            return
        index = record.index
        if index < self._fold_before:
            self._late(record)
            return
        if self._head is not None and index > self._head + self._reorder:
            self._hold(record)
            return
        self._place(record)

    def _hold(self, record: WindowRecord | OverflowRecord) -> None:
        """A window far ahead of all others: a server back after days, or one line with a wrong clock. It moves
        time on only when others join it (``CONFIRM_AHEAD`` records within one reorder window): one stray stamp
        must not push the rest of the logs out of the reorder window. Held records no others join are placed at
        the end."""
        ahead = self._ahead
        ahead.append(record)
        ahead.sort(key=attrgetter("index"))
        together = [held for held in ahead if held.index <= ahead[0].index + self._reorder]
        if len(together) >= CONFIRM_AHEAD or len(ahead) > MAX_AHEAD:
            confirmed = ahead if len(ahead) > MAX_AHEAD else together
            self._ahead = ahead[len(confirmed):]
            for held in confirmed:
                if held.index >= self._fold_before:
                    self._place(held)
                else:
                    self._late(held)

    def _place(self, record: WindowRecord | OverflowRecord) -> None:
        index, file = record.index, record.file
        window = self._windows.get(index)
        if window is None:
            window = self._windows[index] = _Window(f"{self.names[file]}, {record.where}")
            heapq.heappush(self._fold_heap, index)
        if record.kind == WINDOW:
            running, tags, hashes = record.peak_running, record.tags, record.line_hashes
            if running > window.peak_running or not window.tags:
                window.peak_running, window.tags = running, tags
            window.lines[file] = window.lines.get(file, 0) + record.lines
            if hashes is not None:
                if window.hashes is None:
                    window.hashes = {}
                    heapq.heappush(self._dedupe_heap, index)
                mine = window.hashes.get(file)
                if mine is None:
                    window.hashes[file] = hashes
                else:
                    mine.update(hashes)
        else:
            needed, cap, tags = record.tokens_needed, record.cap, record.tags
            if needed is not None and needed > window.overflow_needed:
                window.overflow_needed, window.overflow_tags = needed, tags
            if cap is not None:
                window.cap_seen = max(window.cap_seen, cap)
            window.overflows.setdefault(file, Counter())[(needed, cap, tags)] += 1
        if self._head is None or index > self._head:
            self._advance(index)

    def _start(self, record: ArgsRecord) -> None:
        seconds, config = record.stamp_s, record.config
        if seconds < self._fold_before * self.window_s:
            self.placement.late_starts += 1  # its windows are in the histories already
            return
        segment = self._segment(self.configure(config))
        segment.starts += 1
        segment.first_start_s = seconds if segment.first_start_s is None else min(segment.first_start_s, seconds)
        times, segments = self._change_times, self._change_segments
        at = bisect_right(times, seconds)
        # A window takes the configuration of the last start at or before its start: of several starts
        # between two window starts only the last matters (so a log of endless restarts stays small).
        if at > 0 and math.ceil(times[at - 1] / self.window_s) == math.ceil(seconds / self.window_s):
            times[at - 1], segments[at - 1] = seconds, segment
        else:
            times.insert(at, seconds)
            segments.insert(at, segment)

    def _segment(self, config: ServerConfig, from_flags: bool = False) -> Segment:
        segment = self._segments.pop(config, None)  # re-inserted: the dict's order is the last use
        if segment is None:
            cap = self.cap if self.cap is not None else config.default_cap
            segment = Segment(config, SampleHistory(self.policy.half_life_s, window_s=self.window_s), cap, from_flags,
                              first_start_s=float("-inf") if from_flags else None)
            self.placement.segments.append(segment)
        self._segments[config] = segment
        if len(self._segments) > MAX_CONFIGURATIONS:
            self._evict()
        return segment

    def _evict(self) -> None:
        """The least recently started configuration nothing refers to any more (a hostile log of ever new args)."""
        in_use = {id(segment) for segment in self._change_segments} | {id(self._fallback)}
        for config, segment in self._segments.items():
            if id(segment) not in in_use:
                del self._segments[config]
                self.placement.segments.remove(segment)
                self.placement.dropped_configurations += 1
                return

    # -- time goes on --------------------------------------------------------------------------------------
    def _advance(self, index: int) -> None:
        self._head = index
        dedupe_before = index - DEDUPE_WINDOWS
        heap = self._dedupe_heap
        while heap and heap[0] < dedupe_before:
            self._collapse(self._windows.get(heapq.heappop(heap)))
        fold_before = index - self._reorder
        if fold_before > self._fold_before:
            self._fold_before = fold_before
            heap = self._fold_heap
            while heap and heap[0] < fold_before:
                old = heapq.heappop(heap)
                self._fold(old, self._windows.pop(old))
            self._forget_changes(fold_before * self.window_s)

    def _collapse(self, window: _Window | None) -> None:
        """Count the window's lines, each once across files, and let the hashes go."""
        if window is not None and window.hashes is not None:
            counted = window.decode_count()
            self.placement.duplicate_lines += window.counted + sum(window.lines.values()) - counted
            window.counted, window.lines, window.hashes = counted, {}, None

    def _forget_changes(self, before_s: float) -> None:
        """Only the start in effect at ``before_s`` and those after it can still place a window."""
        drop = bisect_right(self._change_times, before_s) - 1
        if drop > 0:
            del self._change_times[:drop], self._change_segments[:drop]

    def _configuration_at(self, seconds: float) -> Segment | None:
        """The configuration of the window starting at ``seconds``: the last start at or before it; else the
        flags'; else the first start within the window (a log that begins with its start-up line)."""
        times = self._change_times
        at = bisect_right(times, seconds) - 1
        if at >= 0:
            return self._change_segments[at]
        if self._fallback is None and times and times[0] < seconds + self.window_s:
            return self._change_segments[0]
        return self._fallback

    def _fold(self, index: int, window: _Window) -> None:
        self._collapse(window)
        start = index * self.window_s
        lines = window.decode_count()
        overflows = window.overflow_count()
        duplicates = sum(sum(counter.values()) for counter in window.overflows.values()) - overflows
        self.placement.duplicate_lines += duplicates
        segment = self._configuration_at(start)
        if segment is None:
            self.placement.unconfigured.add(lines + overflows, int(start // SECONDS_PER_DAY), window.peak_running,
                                            window.overflow_needed, window.where)
            return
        per_request = segment.config.tokens_per_request
        decode_peak = window.peak_running * per_request
        peak = max(decode_peak, window.overflow_needed)
        segment.decode_lines += lines
        segment.overflow_lines += overflows
        self.placement.decode_lines += lines
        self.placement.overflow_lines += overflows
        if window.cap_seen:
            segment.cap_seen = window.cap_seen
            if self.cap is None:
                segment.cap_in_use = window.cap_seen  # the cap really in use from here on (not in the args)
        cap = max(segment.cap_in_use or 0, window.cap_seen)
        if not overflows and self.cap is None:  # the cap is not given: a window without an assertion did not overflow
            cap = max(cap, peak)
        # The window rule (advisor/sample.py), as the service applies it to reports: the window's decode lines and
        # its assertions are two intervals; a decode line of no running request ran no batch (no step), and each
        # assertion is a step that overflowed. A window of idle lines alone adds nothing.
        middle = start + self.window_s / 2
        sample = next(iter(group_samples((
            RankInterval(dp_rank(window.tags), middle, decode_peak, cap, 0, lines if window.peak_running else 0),
            RankInterval(dp_rank(window.overflow_tags), middle, window.overflow_needed, cap, overflows, overflows),
        ), self.window_s)), None)
        if sample is None:
            return
        if not overflows:
            segment.peak_without_assertion = max(segment.peak_without_assertion, peak)
        segment.history.add(sample, self.policy.bump_factor, self.policy.bump_min_tokens)
        ranks = segment.dp_peak_tokens
        leader = None
        if decode_peak:
            rank = leader = dp_rank(window.tags)
            ranks[rank] = max(ranks.get(rank, 0), decode_peak)
        if window.overflow_needed:
            rank = dp_rank(window.overflow_tags)
            ranks[rank] = max(ranks.get(rank, 0), window.overflow_needed)
            if window.overflow_needed >= decode_peak:
                leader = rank
        if leader is not None:
            segment.dp_peak_windows[leader] = segment.dp_peak_windows.get(leader, 0) + 1
        segment.first_unix_s = start if segment.first_unix_s is None else min(segment.first_unix_s, start)
        segment.last_unix_s = start if segment.last_unix_s is None else max(segment.last_unix_s, start)

    def _late(self, record: WindowRecord | OverflowRecord) -> None:
        day = int(record.index * self.window_s // SECONDS_PER_DAY)
        where = f"{self.names[record.file]}, {record.where}"
        if record.kind == WINDOW:
            self.placement.late.add(record.lines, day, record.peak_running, 0, where)
        else:
            self.placement.late.add(1, day, 0, record.tokens_needed or 0, where)

    def finish(self) -> Placement:
        for held in sorted(self._ahead, key=attrgetter("index")):
            if held.index >= self._fold_before:
                self._place(held)
            else:
                self._late(held)
        for index in sorted(self._windows):
            self._fold(index, self._windows[index])
        self._windows.clear()
        self._fold_heap.clear()
        return self.placement
