"""One log file -> its records, in time order (``reader.py`` merges the files by time).

The file is read as bytes, straight into the buffer the patterns run over (decoding would cost as much as
the search: only lines read one by one are decoded, as UTF-8 with replacement), in chunks of whole lines.
The rare lines (``server_args=``, an overflow assertion) are found by plain substring search and read one
by one; decode lines are read a block at a time by the fast pattern of the file's template
(``line_shapes.fast_pattern``: one regex over the block, at C speed) wherever it accounts for every decode
line of the block; a block where it does not is split in two until the lines it misses are few, and those
are read by the general parser, which learns the template of new shapes. Decode lines are folded per
window as they are read: a chunk yields one record per window (the largest ``#running-req``, the tags of
that line, the number of lines, and — when several files are merged — a hash of each line, so that a
line present in two files counts once).

Memory: one chunk, and a line of at most ``MAX_LINE_BYTES`` bytes (a longer one is counted, not kept).
"""

from __future__ import annotations

import gzip
import sys
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import BinaryIO, NamedTuple

from capwatch.sglang_logs.line_shapes import (
    DECODE_MARK,
    NOT_OVERFLOW,
    OVERFLOW_MARKS,
    Overflow,
    Template,
    Unstamped,
    args_candidate,
    fast_pattern,
    parse_decode_line,
    parse_overflow,
    peak_line_tags,
)
from capwatch.sglang_logs.server_args import ARGS_MARK, MAX_ARGS_CHARS, ServerConfig, UnreadableArgs, read_server_args
from capwatch.sglang_logs.stamps import SECONDS_PER_DAY, STAMP, DayCounter, key_seconds, nearest_day, stamp_unix_s
from capwatch.sglang_logs.wrappers import LineAssembly, unwrap

ARGS, WINDOW, OVERFLOW = 0, 1, 2  # record kinds; at one time, args come first (a start precedes its lines)
LATE, UNCONFIGURED, UNSTAMPED = "late", "unconfigured", "unstamped"  # why a line read was not placed
CHUNK_BYTES = 1 << 22
# No SGLang line is this long (its args line is tens of KiB): a longer one (binary, or not a log) is
# dropped a chunk at a time and counted, so memory stays bounded.
MAX_LINE_BYTES = 1 << 22
_BLOCK_BYTES = 1 << 18  # decode lines are read this much at a time
_SPLIT_MIN_BYTES = 4096  # below this, lines a block's pattern misses are read one by one
_LOOK_BACK_LINES = 64  # an assertion's stamp: the first stamped line above it, this far up
_EXAMPLES = 3  # lines named per kind of problem
_DAYS = 4096  # days an Unplaced tells apart
_ARGS_CACHE = 16  # distinct args texts remembered (a log restarting with the same args parses once)


class WindowRecord(NamedTuple):
    """A file's decode lines of one window: their peak ``#running-req`` and that line's tags."""

    start_s: float
    kind: int  # WINDOW
    file: int  # the file's index among those read
    index: int  # the window's index (start_s // window_s)
    peak_running: int
    tags: str
    lines: int
    line_hashes: Counter | None  # each line's hash, where several files may hold the same lines
    where: str


class OverflowRecord(NamedTuple):
    """An overflow assertion, in the window of the stamped line above it."""

    start_s: float
    kind: int  # OVERFLOW
    file: int
    index: int
    tokens_needed: int | None
    cap: int | None
    tags: str
    where: str


class ArgsRecord(NamedTuple):
    """A start-up ``server_args=`` line."""

    stamp_s: float
    kind: int  # ARGS
    file: int
    config: ServerConfig
    line: int


# Records sort and merge by (time, kind): their first two fields.
LogRecord = WindowRecord | OverflowRecord | ArgsRecord


@dataclass
class Unplaced:
    """Lines that were read but could not be placed in the timeline (one reason), by day, so that the
    advice can tell whether any of them could have changed it. Bounded: past ``_DAYS`` days, the rest
    share one bucket of unknown day (compared against every configuration)."""

    kind: str  # LATE, UNCONFIGURED or UNSTAMPED
    why: str
    lines: int = 0
    by_day: dict[int | None, list] = field(default_factory=dict)  # day -> [max #running-req, max tokens, where]

    def add(self, lines: int, day: int | None, running: int, needed: int, where: str) -> None:
        self.lines += lines
        if day is not None and day not in self.by_day and len(self.by_day) >= _DAYS:
            day = None
        bucket = self.by_day.setdefault(day, [0, 0, where])
        if running > bucket[0] or needed > bucket[1]:
            bucket[2] = where
        bucket[0], bucket[1] = max(bucket[0], running), max(bucket[1], needed)

    def merge(self, other: "Unplaced") -> None:
        for day, (running, needed, where) in other.by_day.items():
            self.add(0, day, running, needed, where)
        self.lines += other.lines

    def highest(self, since_day: float, tokens_per_request: int) -> tuple[int, str] | None:
        """(the most tokens per rank any of these lines needed, where) among lines from ``since_day`` on
        (or of unknown day); None when there are none."""
        found = [(max(running * tokens_per_request, needed), where) for day, (running, needed, where)
                 in self.by_day.items() if day is None or day >= since_day]
        return max(found) if found else None


@dataclass
class FileCounts:
    """What one file held, line by line (every line is counted once, in one of these)."""

    lines: int = 0
    decode: int = 0  # decode lines read (placed or not: the timeline decides)
    args: int = 0
    args_unread: int = 0  # mention server_args= but are no start-up line that reads
    overflow: int = 0
    unusable: int = 0  # look like a decode or overflow line but do not read (number, length)
    unstamped: Unplaced = field(default_factory=lambda: Unplaced(UNSTAMPED, "no usable timestamp"))  # decode lines
    examples: dict[str, list[str]] = field(default_factory=dict)  # kind -> first few "file:line: why"
    dated: bool = False
    undated: bool = False  # time-only stamps with no date: days counted from the file's first line

    @property
    def skipped(self) -> int:
        return (self.lines - self.decode - self.args - self.args_unread - self.overflow - self.unusable
                - self.unstamped.lines)


_ARGS = ARGS_MARK.encode()
_OVERFLOWS = tuple(mark.encode() for mark in OVERFLOW_MARKS)
_DECODE = DECODE_MARK.encode()


def _next_overflow(text: bytes | bytearray, position: int, end: int) -> int:
    """Where the next overflow mark (any of them) starts in ``text[position:end]``; -1 if none."""
    found = [at for at in (text.find(mark, position, end) for mark in _OVERFLOWS) if at >= 0]
    return min(found) if found else -1


STDIN = "-"  # the path that names standard input (``kubectl logs ... | capwatch advise --sglang-log -``)


def open_log(path: str) -> tuple[BinaryIO, BinaryIO]:
    """(the file on disk, its content) for a plain or gzip log, told by the magic number (rotated logs
    are renamed freely). The file's position tells how far the reading got, compressed or not. ``-`` is
    standard input; it and any other stream (a pipe, ``/dev/stdin``, ``<(zcat ...)``) are read without
    seeking: the magic number is peeked at."""
    raw = open(sys.stdin.fileno(), "rb", closefd=False) if path == STDIN else open(path, "rb")
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return raw, gzip.GzipFile(fileobj=raw)
    return raw, raw


def _position(raw: BinaryIO, known: int) -> int:
    """How far ``raw`` has been read; a stream that cannot say (a pipe) keeps ``known``."""
    try:
        return raw.tell()
    except OSError:
        return known


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _read_into(content: BinaryIO, buffer: bytearray, start: int) -> int:
    """Fill ``buffer`` from ``start`` (a gzip stream returns a little at a time); the end of what was read."""
    view = memoryview(buffer)
    try:
        while start < len(buffer):
            got = content.readinto(view[start:])
            if not got:
                break
            start += got
    finally:
        view.release()
    return start


class LogFile:
    """Records of one file (``WindowRecord``, ``OverflowRecord``, ``ArgsRecord``), each chunk's sorted by time."""

    def __init__(self, path: str, index: int, name: str, window_s: float, *, identities: bool = False,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path = path
        self.index = index
        self.name = name
        self.window_s = window_s
        self.identities = identities
        self.chunk_bytes = chunk_bytes
        self.counts = FileCounts()
        self.position = 0  # bytes read on disk (compressed for .gz): the progress bar's measure
        self._by_second = window_s % 60 != 0
        self._template: Template | None = None
        self._pattern = None
        self._getters = (itemgetter(1), itemgetter(2), itemgetter(0)) if identities else \
            (itemgetter(0), itemgetter(1), None)
        self._key_cache: dict[bytes, int | None] = {}
        self._days = DayCounter()
        self._last_index: int | None = None  # the window of the last stamped line read
        self._line_base = 0  # lines before the current chunk
        self._cursor = (0, 0)  # (position in the chunk, line number there): line numbers by counting forward
        self._assembly: LineAssembly | None = None
        self._assembly_line = 0
        self._args_cache: OrderedDict[str, ServerConfig | str] = OrderedDict()

    # -- the file ------------------------------------------------------------------------------------------
    def records(self) -> Iterator[LogRecord]:
        raw, content = open_log(self.path)
        with raw, content:
            carry = b""
            while True:
                # read straight into the buffer the patterns run over (after a newline and the carried part of
                # a line): no copy of the chunk
                buffer = bytearray(1 + len(carry) + self.chunk_bytes)
                buffer[0:1 + len(carry)] = b"\n" + carry
                filled = _read_into(content, buffer, 1 + len(carry))
                if filled == 1 + len(carry):
                    break
                last = buffer.rfind(b"\n", 1 + len(carry), filled)
                if last < 0:  # no line ends in this chunk
                    carry = bytes(buffer[1:filled])
                    if len(carry) > MAX_LINE_BYTES:
                        carry = self._drop_long_line(content)
                    continue
                records = self._chunk(buffer, last + 1)
                carry = bytes(buffer[last + 1:filled])
                del buffer  # a suspended file keeps its records, not its text
                self.position = _position(raw, self.position)
                yield from records
            if carry:
                text = b"\n" + carry + b"\n"
                yield from self._chunk(text, len(text))
            self.position = _position(raw, self.position)
        yield from self._end()

    def _drop_long_line(self, content: BinaryIO) -> bytes:
        """Skip the rest of an over-long line without keeping it; count it as one unusable line."""
        self.counts.lines += 1
        self._unusable(f"a line of more than {MAX_LINE_BYTES:,} bytes (not a log line)", self._line_base + 1)
        self._line_base += 1
        while chunk := content.read(self.chunk_bytes):
            if b"\n" in chunk:
                return chunk[chunk.find(b"\n") + 1:]
        return b""

    def _end(self) -> Iterator[LogRecord]:
        if self._assembly is not None:  # the file ends inside a split line
            specials: list[tuple] = []
            self._assembled(specials)
            yield from specials

    # -- a chunk of whole lines ----------------------------------------------------------------------------
    def _chunk(self, text: bytes | bytearray, end: int) -> list[LogRecord]:
        """The whole lines of ``text[1:end]`` (``text[0]`` is a newline: every line, the first too, follows one)."""
        lines = text.count(b"\n", 1, end)
        self.counts.lines += lines
        self._cursor = (0, self._line_base)
        windows: dict[int, list] = {}
        specials: list[tuple] = []
        position = 1
        if self._assembly is not None:
            position = self._continue_assembly(text, position, end, specials)
        next_args = text.find(_ARGS, position, end)
        next_overflow = _next_overflow(text, position, end)
        while position < end:
            marks = [at for at in (next_args, next_overflow) if at >= 0]
            if not marks:
                self._decode_span(text, position, end, windows)
                break
            at = min(marks)
            line_start = text.rfind(b"\n", 0, at) + 1
            if line_start > position:
                self._decode_span(text, position, line_start, windows)
            line_end = text.find(b"\n", at)
            position = self._special(text, line_start, line_end, end, windows, specials)
            if 0 <= next_args < position:
                next_args = text.find(_ARGS, position, end)
            if 0 <= next_overflow < position:
                next_overflow = _next_overflow(text, position, end)
        self._line_base += lines
        window_s = self.window_s
        records: list[LogRecord] = [WindowRecord(index * window_s, WINDOW, self.index, index, *window)
                                    for index, window in windows.items()]
        records.extend(specials)
        records.sort(key=itemgetter(0, 1))
        return records

    def _line_at(self, text: bytes, position: int) -> int:
        """The line number (1-based, in the file) of the line at ``position`` in this chunk's text."""
        at, line = self._cursor
        if position < at:
            at, line = 0, self._line_base
        line += text.count(b"\n", at, position)
        self._cursor = (position, line)
        return line

    # -- decode lines --------------------------------------------------------------------------------------
    def _decode_span(self, text: bytes, start: int, end: int, windows: dict) -> None:
        while start < end:
            cut = end if end - start <= _BLOCK_BYTES else text.find(b"\n", start + _BLOCK_BYTES, end) + 1 or end
            self._decode_block(text, start, cut, windows)
            start = cut

    def _decode_block(self, text: bytes, start: int, end: int, windows: dict) -> None:
        while start < end:
            mentions = text.count(_DECODE, start, end)
            if not mentions:
                return
            if self._pattern is not None:
                items = self._pattern.findall(text, start - 1, end)  # the newline before the first line too
                if len(items) == mentions:
                    self._take(items, text, start, end, windows)
                    return
                if items and end - start > _SPLIT_MIN_BYTES:
                    middle = text.find(b"\n", (start + end) // 2, end) + 1
                    if start < middle < end:
                        self._decode_block(text, start, middle, windows)
                        self._decode_block(text, middle, end, windows)
                        return
            start = self._read_one_by_one(text, start, end, windows)

    def _take(self, items: list[tuple], text: bytes, start: int, end: int, windows: dict) -> None:
        """The fast pattern's matches, in file order: one max per window key (C-level per group); the tags
        only of a line that sets a window's peak."""
        key_of, running_of, identity_of = self._getters
        used = len(items)
        cursor = start
        for key, grouped in groupby(items, key_of):
            group = list(grouped)
            index = self._key_index(key)
            peak = max(map(int, map(running_of, group)))
            if index is None:
                self.counts.unstamped.add(len(group), None, peak, 0,
                                          f"{self.name}: the timestamp {_text(key)!r} is not a real time")
                used -= len(group)
                continue
            window = windows.get(index)
            if window is None:
                tags, cursor = peak_line_tags(text, cursor, end, key, peak)
                window = windows[index] = [peak, tags, 0, Counter() if identity_of else None,
                                           f"lines stamped {_text(key)}"]
            elif peak > window[0]:
                window[1], cursor = peak_line_tags(text, cursor, end, key, peak)
                window[0] = peak
            window[2] += len(group)
            if identity_of is not None:
                window[3].update(map(hash, map(identity_of, group)))
            self._last_index = index
        self.counts.decode += used

    def _key_index(self, key: bytes) -> int | None:
        cache = self._key_cache
        if key in cache:
            return cache[key]
        day, second = key_seconds(_text(key))
        if second is None:
            return None
        if len(key) <= 8:  # time only: the day depends on the lines before, so it is not cached
            self.counts.undated = True
            return int((self._days.day_of(second) * SECONDS_PER_DAY + second) // self.window_s)
        if len(cache) > 8192:
            cache.clear()
        self.counts.dated = True
        index = cache[key] = int((day * SECONDS_PER_DAY + second) // self.window_s)
        return index

    def _read_one_by_one(self, text: bytes, start: int, end: int, windows: dict) -> int:
        """The general parser, line by line: the lines no fast pattern reads, up to one of a new shape, which
        teaches the file its template (the rest of the block then goes fast again). Where it stopped."""
        position = start
        while True:
            at = text.find(_DECODE, position, end)
            if at < 0:
                return end
            line_start = text.rfind(b"\n", 0, at) + 1
            line_end = text.find(b"\n", at)
            learned = self._decode_line(text, line_start, line_end, windows)
            position = line_end + 1
            if learned:
                return position

    def _decode_line(self, text: bytes, line_start: int, line_end: int, windows: dict) -> bool:
        """One decode line by the general parser; True when it taught the file a new template."""
        raw = _text(text[line_start:line_end])
        line = self._line_at(text, line_start)
        parsed = parse_decode_line(raw)
        if isinstance(parsed, str):
            self._unusable(parsed, line)
            return False
        if isinstance(parsed, Unstamped):
            self.counts.unstamped.add(1, None, parsed.running, 0, f"{self.name}:{line}: {parsed.why}")
            return False
        day = parsed.day
        if day is None:
            self.counts.undated = True
            day = self._days.day_of(parsed.second)
        else:
            self.counts.dated = True
        index = int((day * SECONDS_PER_DAY + parsed.second) // self.window_s)
        window = windows.get(index)
        if window is None:
            window = windows[index] = [parsed.running, parsed.tags, 0, Counter() if self.identities else None,
                                       f"line {line}"]
        elif parsed.running > window[0]:
            window[0], window[1] = parsed.running, parsed.tags
        window[2] += 1
        if self.identities:
            window[3][hash(raw[parsed.identity_start:].encode())] += 1
        self.counts.decode += 1
        self._last_index = index
        if parsed.template is not None and parsed.template != self._template:
            self._template = parsed.template
            self._pattern = fast_pattern(parsed.template, self._by_second, self.identities)
            return True
        return False

    # -- the rare lines ------------------------------------------------------------------------------------
    def _special(self, text: bytes, line_start: int, line_end: int, end: int, windows: dict, specials: list) -> int:
        """A line with an args or overflow mark; returns where reading goes on."""
        raw = _text(text[line_start:line_end])
        if ARGS_MARK in raw:
            content = unwrap(raw)
            candidate = args_candidate(content.text)
            if candidate is not None:
                line = self._line_at(text, line_start)
                if content.partial:  # a runtime split the long line: join its parts first
                    self._assembly, self._assembly_line = LineAssembly(content, MAX_ARGS_CHARS), line
                    return self._continue_assembly(text, line_end + 1, end, specials)
                self._args(content.text, candidate, content.outer_time, line, specials)
                return line_end + 1
        if any(mark in raw for mark in OVERFLOW_MARKS):
            content = unwrap(raw)
            parsed = parse_overflow(content.text)
            if isinstance(parsed, Overflow):
                self._overflow(parsed, text, line_start, raw, specials)
                return line_end + 1
            if parsed != NOT_OVERFLOW:
                self._unusable(parsed, self._line_at(text, line_start))
                return line_end + 1
        if DECODE_MARK in raw:
            self._decode_line(text, line_start, line_end, windows)
        elif ARGS_MARK in raw:
            self.counts.args_unread += 1
            self._example("args", f"{self.name}:{self._line_at(text, line_start)}: mentions server_args= inside "
                                  "other text (a logged request?), not SGLang's start-up line")
        return line_end + 1

    def _continue_assembly(self, text: bytes, position: int, end: int, specials: list) -> int:
        assembly = self._assembly
        while position < end:
            line_end = text.find(b"\n", position)
            piece = unwrap(_text(text[position:line_end]))
            position = line_end + 1
            if not assembly.continues_with(piece):
                continue  # the other stream's line, between two parts: counted as a skipped line
            if assembly.add(piece):
                self._assembled(specials)
                break
        return position

    def _assembled(self, specials: list) -> None:
        assembly, self._assembly = self._assembly, None
        if assembly.overflowed:
            self._args_unread(f"a split args line longer than {MAX_ARGS_CHARS:,} characters", self._assembly_line)
            return
        text = assembly.text()
        candidate = args_candidate(text)
        self._args(text, candidate or "", assembly.first.outer_time, self._assembly_line, specials)

    def _args(self, content: str, candidate: str, outer_time: str | None, line: int, specials: list) -> None:
        cache = self._args_cache
        result = cache.get(candidate)
        if result is None:
            try:
                result = read_server_args(candidate)
            except UnreadableArgs as error:
                result = str(error)
            cache[candidate] = result
            if len(cache) > _ARGS_CACHE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(candidate)
        if isinstance(result, str):
            self._args_unread(f"the server_args line does not read: {result}", line)
            return
        self.counts.args += 1
        seconds = self._stamp_seconds(content[:content.find(ARGS_MARK)], outer_time)
        if seconds is None:
            seconds = self._last_index * self.window_s if self._last_index is not None else float("-inf")
        else:
            self._last_index = int(seconds // self.window_s)
        specials.append(ArgsRecord(seconds, ARGS, self.index, result, line))

    def _args_unread(self, why: str, line: int) -> None:
        self.counts.args_unread += 1
        self._example("args", f"{self.name}:{line}: {why}")

    def _overflow(self, overflow: Overflow, text: bytes, line_start: int, raw: str, specials: list) -> None:
        """The assertion ends a traceback, which SGLang logs as one record: its window is the one of the
        record's first (stamped) line above it, else of the last stamped line read."""
        line = self._line_at(text, line_start)
        index, tags = self._stamp_above(text, line_start)
        if index is None:
            index = self._last_index
        if index is None:
            self._unusable("an overflow assertion with no stamped line before it", line)
            return
        self.counts.overflow += 1
        needed = overflow.needed
        if needed is not None and needed > (1 << 31):
            needed = None
        specials.append(OverflowRecord(index * self.window_s, OVERFLOW, self.index, index, needed, overflow.cap, tags,
                                       f"line {line}"))

    def _stamp_above(self, text: bytes, line_start: int) -> tuple[int | None, str]:
        end = line_start - 1
        for _ in range(_LOOK_BACK_LINES):
            if end <= 0:
                break
            start = text.rfind(b"\n", 0, end) + 1
            content = unwrap(_text(text[start:end]))
            stamp = STAMP.search(content.text, 0, 64)
            if stamp is not None:
                seconds = self._match_seconds(stamp, content.outer_time)
                if seconds is not None:
                    return int(seconds // self.window_s), content.text[stamp.end():stamp.end() + 64]
            end = start - 1
        return None, ""

    def _stamp_seconds(self, prefix: str, outer_time: str | None) -> float | None:
        stamps = list(STAMP.finditer(prefix))
        if stamps:
            return self._match_seconds(stamps[-1], outer_time)
        if outer_time is not None:
            outer = STAMP.match(outer_time.replace("T", " "))
            return self._match_seconds(outer, None) if outer is not None else None
        return None

    def _match_seconds(self, stamp, outer_time: str | None) -> float | None:
        day, second = stamp_unix_s(stamp)
        if second is None:
            return None
        if day is None:
            outer = STAMP.match(outer_time.replace("T", " ")) if outer_time else None
            outer_day, outer_second = stamp_unix_s(outer) if outer is not None else (None, None)
            if outer_day is not None and outer_second is not None:
                day = nearest_day(second, outer_day * SECONDS_PER_DAY + outer_second)
            else:
                day = self._days.day_of(second)
        return float(day * SECONDS_PER_DAY + second)

    # -- counting ------------------------------------------------------------------------------------------
    def _unusable(self, why: str, line: int) -> None:
        self.counts.unusable += 1
        self._example("unusable", f"{self.name}:{line}: {why}")

    def _example(self, kind: str, text: str) -> None:
        examples = self.counts.examples.setdefault(kind, [])
        if len(examples) < _EXAMPLES:
            examples.append(text)
