"""Decode traces: JSON Lines, one step a line, ``{"tokens": [rank0, rank1, ...], "t": 0.25}``.

``tokens`` is each rank's local batch in that step (the number of ranks follows the trace);
``t`` (optional, seconds since start, non-decreasing) paces the replay. Blank lines are
skipped. Every problem is reported with its line number and what to fix.

Reading is bounded whatever the file holds (``/dev/zero``, a line nested 200,000 deep, a
5,000-digit number): at most ``MAX_LINE_CHARS`` per line, ``MAX_TRACE_STEPS`` steps, integers of
at most ``MAX_INT_DIGITS`` digits, and a replay of at most ``MAX_TRACE_SECONDS``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from capwatch.demo.workload import Workload
from capwatch.backends import DEFAULT_BACKEND
from capwatch.usage_errors import CommandError

MAX_TOKENS_PER_RANK = 1 << 20
# The demo's ranks run the default backend's default configuration: its largest EP group.
MAX_DEMO_RANKS = DEFAULT_BACKEND.default_max_ep_size or DEFAULT_BACKEND.max_ep_size
# A demo replays a trace in real time (25 ms a step when it has no "t"): 100,000 steps is 40 minutes.
MAX_TRACE_STEPS = 100_000
MAX_TRACE_SECONDS = 3_600.0  # the largest "t": an hour of replay
MAX_LINE_CHARS = 65_536  # 64 ranks of 7-digit counts fit in under 600
MAX_INT_DIGITS = 18
TRACE_KEYS = ("tokens", "t")
LIMITS_HELP = (f"at most {MAX_TRACE_STEPS:,} steps, {MAX_LINE_CHARS:,} characters a line, "
               f't up to {MAX_TRACE_SECONDS:,.0f} s, {MAX_TOKENS_PER_RANK:,} tokens per rank')


class TraceError(CommandError, ValueError):
    """A trace that cannot be replayed; the message names the file, line and problem (a usage
    error for the CLI: one line, exit 2)."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"the integer {text[:12]}... has {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _load_line(line: str) -> object:
    """One JSON value, bounded: ValueError (with a message for the user) for anything unreadable."""
    try:
        return json.loads(line, parse_int=_bounded_int)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg}); each line must be one object like "
                         '{"tokens": [12, 30]}') from None
    except RecursionError:
        raise ValueError('nested too deeply; each line must be one flat object like {"tokens": [12, 30]}') from None


def bounded_lines(handle: IO[str]) -> Iterator[str]:
    """The lines of ``handle``, each read with a bound: a longer line (or a file without line ends,
    such as ``/dev/zero``) raises TraceError after reading at most ``MAX_LINE_CHARS`` + 1 characters."""
    line_number = 0
    while True:
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        line_number += 1
        if len(line) > MAX_LINE_CHARS:
            raise TraceError(f"{getattr(handle, 'name', '<trace>')}:{line_number}: longer than {MAX_LINE_CHARS:,} "
                             "characters; a trace is JSON Lines, one short object a line")
        yield line


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> Workload:
    token_counts: list[list[int]] = []
    times: list[float] = []
    timed: bool | None = None

    def fail(line_number: int, problem: str) -> TraceError:
        return TraceError(f"{source}:{line_number}: {problem}")

    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise fail(line_number, f"longer than {MAX_LINE_CHARS:,} characters; one short object a line")
        try:
            step = _load_line(line)
        except ValueError as error:
            raise fail(line_number, str(error)) from None
        if not isinstance(step, dict):
            raise fail(line_number, f'expected an object like {{"tokens": [12, 30]}}, got {type(step).__name__}')
        unknown = sorted(set(step) - set(TRACE_KEYS))
        if unknown:
            raise fail(line_number, f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: \"tokens\", \"t\"")
        if "tokens" not in step:
            raise fail(line_number, 'missing "tokens" (a list with one token count per rank)')
        tokens = step["tokens"]
        if not isinstance(tokens, list) or not tokens:
            raise fail(line_number, '"tokens" must be a non-empty list of integers, one per rank')
        for rank, count in enumerate(tokens):
            if isinstance(count, bool) or not isinstance(count, int):
                raise fail(line_number, f'"tokens"[{rank}] must be an integer, got {json.dumps(count)}')
            if not 0 <= count <= MAX_TOKENS_PER_RANK:
                raise fail(line_number, f'"tokens"[{rank}] = {count} is outside 0..{MAX_TOKENS_PER_RANK}')
        if len(tokens) > MAX_DEMO_RANKS:
            raise fail(line_number, f'"tokens" lists {len(tokens)} ranks; at most {MAX_DEMO_RANKS} are supported')
        if token_counts and len(tokens) != len(token_counts[0]):
            raise fail(line_number, f'"tokens" lists {len(tokens)} ranks but the first step lists '
                                    f"{len(token_counts[0])}; every step needs one count per rank")
        has_time = "t" in step
        if timed is None:
            timed = has_time
        elif has_time != timed:
            raise fail(line_number, '"t" must be given on every line or on none')
        if has_time:
            moment = step["t"]
            if isinstance(moment, bool) or not isinstance(moment, (int, float)) or not math.isfinite(moment) \
                    or not 0 <= moment <= MAX_TRACE_SECONDS:
                raise fail(line_number, f'"t" must be a number of seconds in 0..{MAX_TRACE_SECONDS:.0f} '
                                        f"(the replay runs in real time), got {json.dumps(moment)}")
            if times and moment < times[-1]:
                raise fail(line_number, f'"t" = {moment} goes back in time (previous step: {times[-1]})')
            times.append(float(moment))
        token_counts.append(tokens)
        if len(token_counts) > MAX_TRACE_STEPS:
            raise fail(line_number, f"more than {MAX_TRACE_STEPS:,} steps; split the trace")
    if not token_counts:
        raise TraceError(f"{source}: the trace has no steps; write one JSON object per line, "
                         'e.g. {"tokens": [12, 30, 7, 9]}')
    return Workload(token_counts=token_counts, step_times_s=times if timed else None, source=source)


def read_trace(path: str | Path) -> Workload:
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as handle:
            return parse_trace(bounded_lines(handle), source=str(path))
    except FileNotFoundError:
        raise TraceError(f"trace file {path} does not exist") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text; a trace is JSON Lines") from None
    except IsADirectoryError:
        raise TraceError(f"{path} is a directory; pass a JSON Lines file") from None
    except OSError as error:
        raise TraceError(f"cannot read trace file {path}: {error.strerror or error}") from None


def write_trace(workload: Workload, handle: IO[str]) -> None:
    for step, tokens in enumerate(workload.token_counts):
        record: dict = {"tokens": list(tokens)}
        if workload.step_times_s is not None:
            record["t"] = workload.step_times_s[step]
        handle.write(json.dumps(record, separators=(",", ":")) + "\n")
