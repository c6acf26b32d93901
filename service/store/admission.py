"""Which reports the store takes: a bounded number pending (accepted, not yet committed or refused), none
once it is closing. Past the bound, submits are refused (503 + Retry-After), so an overload costs retries
with backoff instead of memory and latency without limit.

The queue to the writer lives here because the checks and the puts are one step under one lock: nothing
is queued after the stop message, and the pending count never passes the bound."""

from __future__ import annotations

import queue
import threading

from capwatch.service.store.errors import StoreUnavailable
from capwatch.service.store.messages import StopWriter, WriterMessage

CLOSED = "the store is closed"


def lost_message(why: str) -> str:
    return (f"the report was not stored: {why}; reports are refused so that none is acknowledged into a file that "
            "is gone or cannot be kept; restore the file, or restart the service (a deleted database starts empty)")


class Admission:
    def __init__(self, max_pending_reports: int):
        self.max_pending_reports = max_pending_reports
        self.queue: queue.SimpleQueue[WriterMessage] = queue.SimpleQueue()  # C: put costs the HTTP loop far less
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        self._lost: str | None = None  # what happened to the database file (file_watch.py): nothing is taken

    @property
    def lost(self) -> str | None:
        return self._lost

    def lose(self, why: str) -> None:
        """Take no report from now on: the database file is not the one opened, or cannot be written."""
        with self._lock:
            self._lost = why

    @property
    def pending(self) -> int:
        """Reports submitted and not yet committed or refused (never above max_pending_reports)."""
        return self._pending

    def _admit(self) -> StoreUnavailable | None:
        if self._closed:
            return StoreUnavailable(CLOSED)
        if self._lost is not None:
            return StoreUnavailable(lost_message(self._lost), retry_after_s=60)
        if self._pending >= self.max_pending_reports:
            return StoreUnavailable(f"the store has {self._pending} reports waiting to be written "
                                    f"(its bound, max_pending_reports); the service is overloaded")
        self._pending += 1
        return None

    def admit(self, message: WriterMessage | None = None) -> StoreUnavailable | None:
        """Count one more pending report, and queue ``message`` with it; or say why not."""
        with self._lock:
            refusal = self._admit()
            if refusal is None and message is not None:
                self.queue.put(message)
        return refusal

    def send(self, message: WriterMessage) -> bool:
        """Queue a message for the writer unless the store is closed (then False: nothing was queued)."""
        with self._lock:
            if self._closed:
                return False
            self.queue.put(message)
            return True

    def settled(self, reports: int) -> None:
        with self._lock:
            self._pending -= reports

    def close(self) -> bool:
        """Refuse from now on and tell the writer to stop; False if already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self.queue.put(StopWriter())
            return True
