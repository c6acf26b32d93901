"""SGLang server logs -> the advisor's group samples, one history per configuration (read by ``advise.py``).

What sglang 0.5.23 writes and what is read from it (notes with the wheel's code: docs/advisor.md):

- at start-up ``server_args={...}`` (``entrypoints/engine.py``), read by ``server_args.py``; a start whose
  args differ from the previous one begins a new configuration (a restart with the same args continues it);
- every ``decode_log_interval`` decode steps, per DP rank, ``[stamp DP{d} ... TP{t} EP{e}] Decode batch,
  #running-req: N, ...`` (``metrics_reporter.py``): the rank dispatches N x tokens per request (SGLang's
  ``_decode_graph_dispatch_tokens_per_rank``); the group's sample per window is the max over DP ranks;
- a cap too small: ``AssertionError: FlashInfer A2A runtime token geometry exceeds its fixed workspace:
  runtime_max_tokens_per_rank=R > max_num_tokens=C`` (``flashinfer.py``): an overflowing window needing R,
  at the stamp of the line before it; C is the cap that was really in use.

Chunks of whole lines go through one regex each (C speed); windows close once the newest line is
``_OPEN_WINDOWS`` windows past them, so memory holds a few windows whatever the log's length. Lines that
look like decode or assertion lines but do not parse (or come before any args line, or too late) are
counted as unusable; other lines are counted as skipped. Timestamps: SGLang's asctime is local time
without a zone, read as UTC (only differences matter; a window is a minute).
"""

from __future__ import annotations

import calendar
import gzip
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import BinaryIO, TextIO

from capwatch.service.advisor.history import SampleHistory
from capwatch.service.advisor.sample import GroupSample
from capwatch.sglang_logs.server_args import ServerConfig, UnreadableArgs, parse_args_dict, server_config

DECODE_MARK = "] Decode batch"
ARGS_MARK = "server_args={"
OVERFLOW_MARK = "runtime_max_tokens_per_rank="

# The scheduler's prefix (scheduler.py configure_scheduler_process, utils/common.py configure_logger):
# "[%Y-%m-%d %H:%M:%S" (".%03d" with SGLANG_LOG_MS) " DP{d} PP{p} ATTN_CP{c} MOE_DP{m} TP{t} EP{e}" "] ".
_PREFIX = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{1,6})?((?: [A-Z_]+\d+)*)\] "
# Decode lines are found in a whole chunk at once: anchored on the newline and a literal date shape,
# which is what lets the regex engine skip the rest of each line at C speed. The prefix group holds
# the milliseconds (SGLANG_LOG_MS) and the rank parts. Ray actors' output carries
# "(SchedulerActor pid=N, ip=A) " first (SGLang's log_parser allows it): a slower pattern, used only
# for a run of lines where the fast one missed some.
_DECODE = re.compile(r"\n\[(\d{4}-\d\d-\d\d \d\d:\d\d)(:\d\d)([^\]\n]*)\] "
                     r"Decode batch[^,\n]*, #running-req: (\d+), ")
_DECODE_ANY = re.compile(r"\n(?:\(\w+ pid=\d+(?:,\s*ip=[\d.]+)?\)\s*)?\[(\d{4}-\d\d-\d\d \d\d:\d\d)(:\d\d)"
                         r"([^\]\n]*)\] Decode batch(?: \[\d+\])?, #running-req: (\d+), ")
_STAMP = re.compile(_PREFIX)
_OVERFLOW = re.compile(r"FlashInfer A2A runtime token geometry exceeds its fixed workspace: "
                       r"runtime_max_tokens_per_rank=(\d+) > max_num_tokens=(\d+)")
_DP = re.compile(r" DP(\d+)")
_OPEN_WINDOWS = 4
# Groups of decode matches (minute, :second, prefix, running): by minute when a window holds whole
# minutes (the default 60 s), else by second.
_MINUTE_OF = itemgetter(0)
_SECOND_OF = itemgetter(0, 1)
_RUNNING_OF = itemgetter(3)


class LogError(ValueError):
    """The logs cannot be advised on: no decode lines, or an args line that does not read."""


@dataclass
class _Window:
    peak_running_requests: int = 0
    overflow_tokens: int = 0
    overflow_events: int = 0
    cap_seen: int = 0
    hottest_dp_rank: int = -1


@dataclass
class Segment:
    """One configuration: from a start-up args line until a start with different args."""

    config: ServerConfig
    history: SampleHistory
    starts: int = 1
    decode_lines: int = 0
    overflow_lines: int = 0
    cap_seen: int | None = None  # max_num_tokens of an assertion: the cap that was really in use
    dp_peak_tokens: dict[int, int] = field(default_factory=dict)  # DP rank -> its largest R
    first_unix_s: float | None = None
    last_unix_s: float | None = None


@dataclass
class LogRead:
    segments: list[Segment]
    lines: int = 0
    decode_lines: int = 0
    args_lines: int = 0
    overflow_lines: int = 0
    skipped_lines: int = 0  # other log output: neither args, decode nor assertion lines
    unusable_lines: int = 0  # looked like a decode/assertion line but did not parse, came too late,
    # or came before any args line
    files: int = 0


def open_log(path: str) -> tuple[BinaryIO, TextIO]:
    """(the file on disk, its text) for a plain or gzip log, told by the magic number (rotated logs
    are renamed freely). The file's position tells how far the reading got, compressed or not."""
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return raw, io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="replace")
    raw.seek(0)
    return raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def _unix_s(stamp: str) -> float:
    return float(calendar.timegm((int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10]),
                                  int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19]), 0, 0, 0)))


class LogReader:
    """Feed lines in time order (``feed``); ``finish`` closes the last windows."""

    def __init__(self, window_s: float, half_life_s: float, bump_factor: float, bump_min_tokens: int,
                 cap: Callable[[ServerConfig], int]) -> None:
        self.window_s = window_s
        self.half_life_s = half_life_s
        self.bump = (bump_factor, bump_min_tokens)
        self.cap_of = cap
        self._by_minute = window_s % 60 == 0
        self._group_key = _MINUTE_OF if self._by_minute else _SECOND_OF
        self.read = LogRead([])
        self._segment: Segment | None = None
        self._cap = 0
        self._windows: dict[int, _Window] = {}
        self._newest = -1
        self._closed_before = -1
        self._stamps: dict[str, int] = {}  # stamp -> window index (lines share seconds)
        self._dp_of: dict[str, int] = {}  # prefix -> DP rank
        self._last_stamp_window = -1
        self._last_dp = 0

    # -- lines -------------------------------------------------------------------------------------------
    def feed(self, text: str) -> None:
        """A chunk of whole lines. Decode lines are found by one regex over the chunk (C speed);
        the rare args and assertion lines split the chunk where they occur, in order."""
        read = self.read
        read.lines += text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        text = "\n" + text  # every line, the first too, follows a newline
        position = 1
        while True:
            args_at = text.find(ARGS_MARK, position)
            overflow_at = text.find(OVERFLOW_MARK, position)
            found = [at for at in (args_at, overflow_at) if at >= 0]
            if not found:
                break
            at = min(found)
            line_start = text.rfind("\n", 0, at) + 1
            line_end = text.find("\n", at)
            line_end = len(text) if line_end < 0 else line_end
            self._decode_run(text, position, line_start)
            if at == args_at:
                self._args(text[line_start:line_end])
            else:
                self._overflow(text, line_start, line_end)
            position = line_end + 1
        self._decode_run(text, position, len(text))

    def _decode_run(self, text: str, start: int, end: int) -> None:
        if start >= end:
            return
        read = self.read
        # the newline before the run's first line is part of the pattern: start one character early
        matches = _DECODE.findall(text, start - 1, end)
        mentions = text.count(DECODE_MARK, start, end)
        if len(matches) < mentions:
            matches = _DECODE_ANY.findall(text, start - 1, end)
        segment = self._segment
        if segment is None:
            read.unusable_lines += mentions  # before any args line: tokens per request unknown
            return
        read.unusable_lines += mentions - len(matches)
        stamps = self._stamps
        windows = self._windows
        closed_before = self._closed_before
        late = 0
        # Lines of one minute (or second) fall in one window: group them (C-level), one max per group.
        for key, group in groupby(matches, self._group_key):
            index = stamps.get(key)
            if index is None:
                index = self._window_index(key if self._by_minute else key[0] + key[1], key)
            items = list(group)
            if index <= closed_before:
                late += len(items)
                continue
            window = windows.get(index)
            if window is None:
                window = windows[index] = _Window()
                if index > self._newest:
                    self._advance(index)
                    closed_before = self._closed_before
            requests = list(map(int, map(_RUNNING_OF, items)))
            peak = max(requests)
            if peak > window.peak_running_requests:
                window.peak_running_requests = peak
                window.hottest_dp_rank = self._dp(items[requests.index(peak)][2])
        read.unusable_lines += late
        segment.decode_lines += len(matches) - late
        read.decode_lines += len(matches) - late
        if matches:
            self._last_stamp_window = self._window_index(matches[-1][0] + matches[-1][1])
            self._last_dp = self._dp(matches[-1][2])

    def _window_index(self, stamp: str, key: object = None) -> int:
        """The window of 'YYYY-MM-DD HH:MM[:SS]' (a minute key counts from its start), cached under ``key``."""
        if len(self._stamps) > 8192:
            self._stamps.clear()
        index = self._stamps[stamp if key is None else key] = int(
            _unix_s(stamp if len(stamp) == 19 else stamp + ":00") // self.window_s)
        return index

    def _dp(self, prefix: str) -> int:
        rank = self._dp_of.get(prefix)
        if rank is None:
            if len(self._dp_of) > 4096:  # milliseconds make many prefixes
                self._dp_of.clear()
            found = _DP.search(prefix)
            rank = self._dp_of[prefix] = int(found.group(1)) if found else 0
        return rank

    def _overflow(self, text: str, line_start: int, line_end: int) -> None:
        """The assertion's line is not stamped (it ends a traceback); its window is the one of the
        stamped line before it ("Scheduler hit an exception: ..."), its DP rank that line's."""
        read = self.read
        match = _OVERFLOW.search(text, line_start, line_end)
        segment = self._segment
        if match is None or segment is None:
            read.unusable_lines += 1
            return
        index, rank = self._last_stamp_window, self._last_dp
        before = text.rfind("\n[", max(0, line_start - 65536), line_start)
        stamp_match = _STAMP.match(text, before + 1) if before >= 0 else _STAMP.match(text, line_start)
        if stamp_match is not None:
            index, rank = self._window_index(stamp_match.group(1)), self._dp(stamp_match.group(2))
        if index < 0 or index <= self._closed_before:
            read.unusable_lines += 1
            return
        needed, cap = int(match.group(1)), int(match.group(2))
        window = self._windows.setdefault(index, _Window())
        window.overflow_events += 1
        window.overflow_tokens = max(window.overflow_tokens, needed)
        window.cap_seen = max(window.cap_seen, cap)
        segment.overflow_lines += 1
        read.overflow_lines += 1
        segment.cap_seen = cap
        self._cap = cap  # the cap really in use from here on (the env var is not in the log)
        segment.dp_peak_tokens[rank] = max(segment.dp_peak_tokens.get(rank, 0), needed)
        if index > self._newest:
            self._advance(index)

    def _args(self, line: str) -> None:
        try:
            config = server_config(parse_args_dict(line[line.find(ARGS_MARK) + len("server_args="):]))
        except UnreadableArgs as error:
            raise LogError(f"the server_args line cannot be read: {error}") from None
        stamp_match = _STAMP.match(line)
        if stamp_match is not None:
            self._last_stamp_window = self._window_index(stamp_match.group(1))
        self.read.args_lines += 1
        if self._segment is not None and self._segment.config == config:
            self._segment.starts += 1  # a restart with the same args: the same configuration
            return
        self._close_all()
        self._segment = Segment(config, SampleHistory(self.half_life_s, window_s=self.window_s))
        self._cap = self.cap_of(config)
        self._newest = self._closed_before = -1  # a new configuration's windows start afresh
        self.read.segments.append(self._segment)

    # -- windows -----------------------------------------------------------------------------------------
    def _advance(self, index: int) -> None:
        self._newest = index
        horizon = index - _OPEN_WINDOWS
        if horizon > self._closed_before:
            for old in sorted(key for key in self._windows if key <= horizon):
                self._close(old, self._windows.pop(old))
            self._closed_before = horizon

    def _close(self, index: int, window: _Window) -> None:
        segment = self._segment
        if segment is None:
            return
        tokens_per_request = segment.config.tokens_per_request
        peak = max(window.peak_running_requests * tokens_per_request, window.overflow_tokens)
        if peak == 0 and not window.overflow_events:
            return
        start = index * self.window_s
        cap = max(self._cap, window.cap_seen)
        segment.history.add(GroupSample(start, peak, cap, window.overflow_events), *self.bump)
        if window.hottest_dp_rank >= 0:
            rank = window.hottest_dp_rank
            segment.dp_peak_tokens[rank] = max(segment.dp_peak_tokens.get(rank, 0),
                                               window.peak_running_requests * tokens_per_request)
        segment.first_unix_s = start if segment.first_unix_s is None else min(segment.first_unix_s, start)
        segment.last_unix_s = start if segment.last_unix_s is None else max(segment.last_unix_s, start)

    def _close_all(self) -> None:
        for index in sorted(self._windows):
            self._close(index, self._windows[index])
        if self._windows:
            self._closed_before = max(self._closed_before, max(self._windows))
        self._windows.clear()

    def finish(self) -> LogRead:
        self._close_all()
        read = self.read
        read.skipped_lines = max(0, read.lines - read.decode_lines - read.args_lines - read.overflow_lines
                                 - read.unusable_lines)
        return read


_CHUNK_CHARS = 1 << 22
# No SGLang line is this long (its server_args dict is tens of KiB): beyond it, a file without newlines
# (binary, or not a log) is dropped a chunk at a time and counted, so memory stays bounded.
MAX_LINE_CHARS = 4 * _CHUNK_CHARS


def read_logs(paths: list[str], window_s: float, half_life_s: float, bump_factor: float, bump_min_tokens: int,
              cap: int | None = None, progress: Callable[[int], None] | None = None) -> LogRead:
    """Read the files in the order given (rotated logs oldest first). ``progress`` gets the bytes read
    so far (on disk: compressed bytes for .gz) after every batch of lines."""
    reader = LogReader(window_s, half_life_s, bump_factor, bump_min_tokens,
                       cap=(lambda config: cap) if cap is not None else (lambda config: config.default_cap))
    done = 0
    for path in paths:
        raw, text = open_log(path)
        with raw, text:
            carry = ""
            while True:
                chunk = text.read(_CHUNK_CHARS)
                if not chunk:
                    break
                cut = chunk.rfind("\n") + 1
                if cut == 0:  # a line longer than a chunk (an args dict can be long): keep reading it
                    carry += chunk
                    if len(carry) > MAX_LINE_CHARS:
                        reader.read.lines += 1
                        reader.read.unusable_lines += 1
                        carry = ""
                        while (chunk := text.read(_CHUNK_CHARS)) and "\n" not in chunk:
                            pass  # the rest of that one over-long line
                        carry = chunk[chunk.find("\n") + 1:] if chunk else ""
                    continue
                reader.feed(carry + chunk[:cut])
                carry = chunk[cut:]
                if progress is not None:
                    progress(done + raw.tell())
            if carry:
                reader.feed(carry)
            done += raw.tell()
        reader.read.files += 1
    return reader.finish()
