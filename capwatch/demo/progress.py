"""What the demo's rank processes tell the foreground while they run: one ``RankProgress`` record per
rank in shared memory, written by its rank (``rank_process``), read by the progress bar (``session``).
One definition of the fields, by name, for both sides."""

from __future__ import annotations

import ctypes
from enum import IntEnum


class Phase(IntEnum):
    STARTING = 0
    RUNNING = 1
    REPORTED = 2  # the final report went out; exporter still up while holding
    FINISHED = 3


class RankProgress(ctypes.Structure):
    """One rank's record: written only by that rank, a store per step at most (never on the hot path)."""

    _fields_ = [
        ("phase", ctypes.c_int64),  # a Phase
        ("steps_done", ctypes.c_int64),
        ("overflow_events", ctypes.c_int64),  # every 25 steps, and at the end
        ("raised", ctypes.c_int64),  # 1 once the dispatcher raised (overflow policy "raise")
        ("reports_lost", ctypes.c_int64),  # once REPORTED: reports the service refused or never acknowledged
        ("reports_merged", ctypes.c_int64),  # once REPORTED: reports merged into the next (the service was slow)
    ]


def shared_progress(ranks: int):
    """``ranks`` zeroed records in shared memory; pass it to the spawned ranks as an argument and index it
    by rank (``progress[rank].steps_done``) on either side."""
    import multiprocessing

    return multiprocessing.get_context("spawn").RawArray(RankProgress, ranks)
