"""The database file under the service's feet: still the file the store opened, and still writable?

SQLite keeps writing to the file (and write-ahead log) it opened, whatever happens to their names: a database
deleted or replaced under the service took every report acknowledged afterwards with it (150 were gone after a
restart), and reads through new connections found another file (500s). A file made immutable (``chattr +i``) can
no longer take the log's checkpoints, and the log grows without end. So the writer asks before every commit, and
every second when idle, and a change is loss noticed: the store refuses reports from then on (503: a rank keeps
them buffered and retries), reads that need the file answer 503, and the log says what happened, once.


When the file at the path is no longer the one opened (deleted, moved, or replaced: an operator restoring a backup
with ``mv``), what the store held is copied from its still-open connection beside it (``set_aside``), and the
write-ahead log and shared memory the store left at the path are moved aside: SQLite reads ``X-wal`` as ``X``'s own
log, so the next start applied the replaced database's log to the restored file (damaged, or overwritten).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Identity:
    device: int
    inode: int

    @classmethod
    def of(cls, path: str) -> _Identity | None:
        try:
            status = os.stat(path)
        except FileNotFoundError:
            return None
        return cls(status.st_dev, status.st_ino)


class DatabaseFile:
    """The database file and its write-ahead log as the store opened them."""

    def __init__(self, path: str):
        self.path = path
        self._database = _Identity.of(path)
        self._log = _Identity.of(path + "-wal")  # present while a connection holds the database in WAL mode

    def problem(self) -> str | None:
        """What happened to the file since it was opened, in words (None: nothing)."""
        for name, path, opened in (("database file", self.path, self._database),
                                   ("write-ahead log", self.path + "-wal", self._log)):
            if opened is None:
                continue
            now = _Identity.of(path)
            if now is None:
                return f"its {name} {path} was deleted while the service ran"
            if now != opened:
                return f"its {name} {path} was replaced by another file while the service ran"
        if not os.access(self.path, os.W_OK):
            return (f"its database file {self.path} can no longer be written (its permissions or an immutable "
                    "flag changed while the service ran: see ls -l and lsattr)")
        return None

    def moved_away(self) -> bool:
        """Whether the file at the path (or its log) is no longer the one opened: deleted, moved or replaced."""
        return _Identity.of(self.path) != self._database or (
            self._log is not None and _Identity.of(self.path + "-wal") not in (self._log, None))

    def set_aside(self, connection: sqlite3.Connection) -> str | None:
        """Once the file was moved away: copy the database the store still holds open (its log applied) to
        ``<path>.lost-<time>``, and move the log files it left at the path to ``<path>-wal.lost-<time>`` and
        ``<path>-shm.lost-<time>``, where SQLite cannot take them for another file's. Returns the copy's path
        (None when it could not be made: said in the log). Never raises: the store goes on refusing."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        copy = f"{self.path}.lost-{stamp}"
        try:
            with sqlite3.connect(copy) as target:
                connection.backup(target)
            target.close()
        except (sqlite3.Error, OSError) as error:
            log.error("could not copy what the database held to %s (%s)", copy, error)
            copy = None
        if self._log is not None and _Identity.of(self.path + "-wal") == self._log:  # its own log, at the path
            for suffix in ("-wal", "-shm"):
                try:
                    os.replace(self.path + suffix, f"{self.path}{suffix}.lost-{stamp}")
                except FileNotFoundError:
                    pass
                except OSError as error:
                    log.error("could not move %s aside (%s): move it away before the next start, or SQLite "
                              "applies it to the file now at %s", self.path + suffix, error, self.path)
        return copy
