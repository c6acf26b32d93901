"""SGLang server logs -> the advisor's group samples, one history per configuration (read by ``advise.py``).

    files (any number, any order, plain or gzip)       log_file.py: each file's records, in time order
      -> one streaming merge by time                   heapq.merge: one chunk per file in memory
      -> one timeline                                  timeline.py: windows, configurations, duplicates
      -> LogRead                                       every line counted once, in one of its counters

What is read (every shape: line_shapes.py, stamps.py, wrappers.py; the list with the releases that write
each: docs/sglang-logs.md): the start-up ``server_args=`` line (``server_args.py``), the decode lines
(one per DP rank every ``decode_log_interval`` steps: the rank dispatches ``#running-req`` x tokens per
request; the group's sample per window is the max over every line of every file), and the overflow
assertions (an overflowing window needing R; the cap that was in use when the message says it).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

from capwatch.advisor.policy import DEFAULT_POLICY, AdvisorPolicy
from capwatch.advisor.sample import DEFAULT_WINDOW_S
from capwatch.sglang_logs.log_file import CHUNK_BYTES, UNSTAMPED, LogFile, Unplaced
from capwatch.sglang_logs.server_args import ServerConfig
from capwatch.sglang_logs.timeline import Segment, Timeline

_MEMORY_FOR_CHUNKS = 1 << 26  # bytes of chunks, all files together (each at least 256 KiB, at most 4 MiB)
_PROGRESS_EVERY = 64  # records between two progress calls


class LogError(ValueError):
    """The logs cannot be advised on: one line that says why and what to do."""


@dataclass
class LogRead:
    segments: list[Segment]
    files: int = 0
    lines: int = 0
    decode_lines: int = 0  # placed in a configuration's history, each line once
    duplicate_lines: int = 0  # decode or overflow lines already read in another file
    args_lines: int = 0  # start-up lines read
    args_unread: int = 0  # mention server_args= but are no start-up line that reads
    overflow_lines: int = 0  # placed overflow assertions
    unusable_lines: int = 0  # look like a decode or overflow line but do not read (a number, a length)
    skipped_lines: int = 0  # other output: neither of the above
    unplaced: list[Unplaced] = field(default_factory=list)  # read, but not placed in time (by reason)
    examples: dict[str, list[str]] = field(default_factory=dict)  # kind -> the first few lines, named
    undated_files: list[str] = field(default_factory=list)  # time-only stamps: days counted from line 1
    late_starts: int = 0
    dropped_configurations: int = 0

    @property
    def unplaced_lines(self) -> int:
        return sum(unplaced.lines for unplaced in self.unplaced)


def _unchanged(config: ServerConfig) -> ServerConfig:
    return config


# Open files besides the logs: the interpreter's, the advisor's, a progress bar's terminal.
SPARE_FILES = 64


def hold_open_files(count: int) -> None:
    """The files are merged by time, so all are open at once: raise this process's soft open-files limit to hold
    them (up to the hard limit), or refuse before reading, in one line (25,000 files against ``ulimit -n`` 20,000
    ended after 72 s naming an innocent file, "Too many open files: '.../r5496.log'; is the file complete?")."""
    import resource

    needed = count + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise LogError(f"{count:,} log files are read at once (merged by time), and this process may open at most "
                       f"{hard:,} files (ulimit -Hn); raise the limit to {needed:,} or more, or advise on fewer "
                       "files at a time (one rank's or one node's)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def read_logs(paths: list[str], *, window_s: float = DEFAULT_WINDOW_S, policy: AdvisorPolicy = DEFAULT_POLICY,
              cap: int | None = None, fallback: ServerConfig | None = None,
              configure: Callable[[ServerConfig], ServerConfig] = _unchanged,
              progress: Callable[[int], None] | None = None, chunk_bytes: int | None = None) -> LogRead:
    """Read every file into one timeline, its windows folded by the advisor's ``policy`` (half-life, overflow
    bump). ``cap``: the cap the server runs with (else each configuration's
    SGLang default, or what its overflow assertions show); ``fallback``: the configuration of lines before
    any start-up line (from flags); ``configure``: flags applied to every configuration read; ``progress``
    gets the bytes read so far (on disk: compressed bytes for .gz); ``chunk_bytes``: read at a time per file
    (default: 64 MiB shared by the files, between 256 KiB and 4 MiB each)."""
    hold_open_files(len(paths))
    chunk_bytes = chunk_bytes or max(1 << 18, min(CHUNK_BYTES, _MEMORY_FOR_CHUNKS // max(1, len(paths))))
    files = [LogFile(path, index, path, window_s, identities=len(paths) > 1, chunk_bytes=chunk_bytes)
             for index, path in enumerate(paths)]
    timeline = Timeline(window_s, policy, cap=cap, fallback=fallback,
                        configure=configure, names=paths)
    merged = heapq.merge(*(file.records() for file in files), key=itemgetter(0, 1))
    for count, record in enumerate(merged):
        timeline.add(record)
        if progress is not None and count % _PROGRESS_EVERY == 0:
            progress(sum(file.position for file in files))
    placement = timeline.finish()
    if progress is not None:
        progress(sum(file.position for file in files))

    read = LogRead(placement.segments, files=len(files), decode_lines=placement.decode_lines,
                   duplicate_lines=placement.duplicate_lines, overflow_lines=placement.overflow_lines,
                   late_starts=placement.late_starts, dropped_configurations=placement.dropped_configurations)
    unstamped = Unplaced(UNSTAMPED, "no usable timestamp")
    for file in files:
        counts = file.counts
        read.lines += counts.lines
        read.args_lines += counts.args
        read.args_unread += counts.args_unread
        read.unusable_lines += counts.unusable
        read.skipped_lines += counts.skipped
        unstamped.merge(counts.unstamped)
        for kind, examples in counts.examples.items():
            read.examples.setdefault(kind, []).extend(examples[:3 - len(read.examples.get(kind, []))])
        if counts.undated:
            read.undated_files.append(file.name)
    read.unplaced = [unplaced for unplaced in (placement.late, placement.unconfigured, unstamped) if unplaced.lines]
    dated = [file.name for file in files if file.counts.dated]
    if read.undated_files and dated:
        raise LogError(f"{read.undated_files[0]} has time-only stamps (SGLang before 2024-09 wrote no date) and "
                       f"{dated[0]} has dated ones: they cannot share one timeline; advise on each kind separately")
    return read
