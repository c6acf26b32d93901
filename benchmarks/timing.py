"""Timing shared by the benchmarks: medians over repeats, robust to the odd slow run on a shared machine."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``action()`` over ``repeats`` calls."""
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def median_ms(action: Callable[[], object], repeats: int) -> float:
    return round(median_seconds(action, repeats) * 1e3, 3)
