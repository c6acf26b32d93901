"""The asyncio side of the writer thread: the reports of one event-loop iteration reach the writer
together, and a committed batch settles its waiters with ONE wake-up per loop. Each wake-up is a GIL
hand-over between the HTTP loop and the writer, the ingest path's main cost (a cross-thread future per
report cost more than the commit itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from capwatch.service.store.messages import LoopWaiter, PendingReport


def _settle(outcomes: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue  # the client went away; the report is stored all the same
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def settle(batch: list[PendingReport], results: list | None, error: BaseException | list | None) -> None:
    """Settle every waiter of a batch: concurrent futures directly, asyncio futures per loop in one call.
    ``error``: one for the whole batch, or one (or None) per report."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for index, pending in enumerate(batch):
        result = results[index] if results is not None else None
        waiter = pending.waiter
        failure = error[index] if isinstance(error, list) else error
        if failure is not None:
            result = None
        if isinstance(waiter, LoopWaiter):
            by_loop.setdefault(waiter.loop, []).append((waiter.future, result, failure))
        elif failure is not None:
            waiter.set_exception(failure)
        else:
            waiter.set_result(result)
    for loop, outcomes in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, outcomes)
        except RuntimeError:  # that loop has closed: nobody is waiting any more
            pass


class LoopGathering:
    """Per event loop, the reports submitted during the current iteration; handed over together when the
    loop runs its next callbacks. Each loop's list is touched by that loop only."""

    def __init__(self, hand_over: Callable[[list[PendingReport]], None]):
        self._hand_over = hand_over
        self._gathering: dict[asyncio.AbstractEventLoop, list[PendingReport]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, pending: PendingReport) -> None:
        gathered = self._gathering.get(loop)
        if gathered is None:
            gathered = self._gathering[loop] = []
            loop.call_soon(self._flush, loop)
        gathered.append(pending)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._hand_over(self._gathering.pop(loop))
