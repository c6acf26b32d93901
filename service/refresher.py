"""A background thread that keeps something current in slices: ``refresh(slice_s)`` is called, then the thread
leaves the readers a pause (shorter while work remains, longer when all is current). The refresher of
``GroupDigests`` (``digests.py``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Refresher:
    """``refresh(slice_s)`` returns how much is still to do; an error is logged and retried on the next pass."""

    def __init__(self, refresh: Callable[[float], int], *, what: str, name: str, slice_s: float, pause_s: float,
                 idle_s: float):
        self.refresh = refresh
        self.what = what  # for the log: what it keeps current
        self.name = name  # the thread's
        self.slice_s, self.pause_s, self.idle_s = slice_s, pause_s, idle_s
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def stopping(self) -> bool:
        """Asked to stop: work under way ends early."""
        return self._stop.is_set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        pause = self.idle_s
        while not self._stop.wait(pause):
            try:
                remaining = self.refresh(self.slice_s)
            except Exception:  # the source briefly unreadable: the next pass retries
                log.exception("cannot refresh %s; retrying", self.what)
                remaining = 0
            pause = self.pause_s if remaining else self.idle_s
