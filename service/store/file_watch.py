"""The database file under the service's feet: still the file the store opened, and still writable?

SQLite keeps writing to the file (and write-ahead log) it opened, whatever happens to their names: a database
deleted or replaced under the service took every report acknowledged afterwards with it (150 were gone after a
restart), and reads through new connections found another file (500s). A file made immutable (``chattr +i``) can
no longer take the log's checkpoints, and the log grows without end. So the writer asks before every commit, and
every second when idle, and a change is loss noticed: the store refuses reports from then on (503: a rank keeps
them buffered and retries), reads that need the file answer 503, and the log says what happened, once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


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
