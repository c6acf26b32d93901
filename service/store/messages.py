"""What the writer's queue carries, told apart by type, and who waits for each report's acknowledgement."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from capwatch.telemetry.report import RankReport


@dataclass(frozen=True)
class LoopWaiter:
    """An asyncio future of ``loop``: settled from the writer thread through the loop (``loop_bridge.py``)."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


Waiter = concurrent.futures.Future | LoopWaiter


@dataclass(frozen=True)
class PendingReport:
    """One validated report waiting for its commit, and who waits for the acknowledgement."""

    report: RankReport
    received_unix_s: float
    payload: bytes | None  # the JSON as received, stored as is
    waiter: Waiter


@dataclass(frozen=True)
class ReportBatch:
    """Reports to commit together: one ``submit``, or one event-loop iteration's ``submit_async`` calls."""

    reports: list[PendingReport]


@dataclass(frozen=True)
class WriterCall:
    """A function to run on the writer's connection, between batches."""

    function: Callable[[sqlite3.Connection], object]
    future: concurrent.futures.Future


@dataclass(frozen=True)
class StopWriter:
    """Sent once, by ``close``: commit what came before, refuse what comes after."""


WriterMessage = ReportBatch | WriterCall | StopWriter
