"""Helpers of the log-reader tests: logs written from the format templates (tests/support/sglang_logs.py),
read with the reader's defaults, and the history their lines must give, built independently."""

from __future__ import annotations

import gzip
import random
import subprocess
from collections.abc import Callable

from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.sample import GroupSample
from capwatch.sglang_logs.reader import read_logs

from tests.support import launcher
from tests.support import sglang_logs as sg

T0 = 1_764_504_000.0  # 2025-11-30 12:00:00, a window start
POLICY = AdvisorPolicy()  # what the reader folds by unless told otherwise
DP = 8


def rank(dp: int) -> sg.Rank:
    return sg.Rank(dp=dp, tp=dp, ep=dp)


def write(path, lines: list[str], gz: bool = False) -> str:
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return str(path)


def read(paths: list[str], **options):
    return read_logs(paths, **options)  # the service's window and the advisor's default policy


def traffic(minutes: int, running: Callable[[int, int, int], int], start_s: float = T0, every_s: float = 2.0,
            ranks: int = DP) -> list[tuple[float, int, int]]:
    """(unix_s, dp rank, #running-req): one decode line per DP rank every ``every_s`` seconds;
    running(minute, second, dp)."""
    return [(start_s + minute * 60 + second + dp * 0.01, dp, running(minute, second, dp))
            for minute in range(minutes) for second in range(0, 60, int(every_s)) for dp in range(ranks)]


def random_traffic(minutes: int, seed: int, start_s: float = T0, hot_rank: int = 5) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    return traffic(minutes, lambda m, s, d: rng.randint(1, 120) + (60 if d == hot_rank else 0), start_s)


def decode_lines(log: sg.LogFormat, lines: list[tuple[float, int, int]], **variant) -> list[str]:
    return [text for at, dp, running in lines for text in log.decode(at, running, rank(dp), **variant)]


def expected_history(lines: list[tuple[float, int, int]], cap: int, tokens_per_request: int = 1,
                     overflows: dict[int, int] | None = None, window_s: float = 60.0) -> SampleHistory:
    """What the advisor must see: per window, the largest #running-req of any line x tokens per request
    (an overflow's need if larger, with its event), in window order."""
    peaks: dict[int, int] = {}
    for at, _, running in lines:
        index = int(at // window_s)
        peaks[index] = max(peaks.get(index, 0), running * tokens_per_request)
    overflows = overflows or {}
    history = SampleHistory(POLICY.half_life_s, window_s=window_s)
    for index in sorted(set(peaks) | set(overflows)):
        peak = max(peaks.get(index, 0), overflows.get(index, 0))
        if peak or index in overflows:
            history.add(GroupSample(index * window_s, peak, cap, 1 if index in overflows else 0), POLICY.bump_factor,
                        POLICY.bump_min_tokens)
    return history


def every_line_counted_once(result) -> bool:
    """Every line of the files is in exactly one of the read's counters."""
    counted = (result.decode_lines + result.duplicate_lines + result.args_lines + result.args_unread
               + result.overflow_lines + result.unusable_lines + result.unplaced_lines + result.skipped_lines)
    return counted == result.lines


def advise(*args: str, timeout_s: float = 300, **options) -> subprocess.CompletedProcess:
    """``capwatch advise ARGS`` as a user runs it (tests.support.launcher)."""
    return launcher.run_capwatch("advise", *args, timeout_s=timeout_s, **options)


def read_description(reasons: list[str]) -> str:
    """The advice's reason about what was read: the first, or the second after a low-confidence lead."""
    return next(reason for reason in reasons[:2] if reason.startswith("read "))
