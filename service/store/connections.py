"""Connections to the database file: one for the writer, one per reading thread.

WAL lets readers read while the writer writes; ``synchronous=FULL`` makes a COMMIT durable (not just
crash-consistent), which is what an acknowledged report promises.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from capwatch.service.store.errors import StoreDamaged, StoreInaccessible


def connect(path: str, create: bool = False) -> sqlite3.Connection:
    """A connection to the database at ``path``; only the store's first (``create``) may create the file: any
    later one opening a path where the file is gone would make a new, empty database there (file_watch.py)."""
    uri = f"{Path(path).absolute().as_uri()}?mode={'rwc' if create else 'rw'}"
    try:
        connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30.0)
    except sqlite3.OperationalError as error:
        raise StoreInaccessible(f"SQLite cannot open it ({error})") from None
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")  # durable at COMMIT, not just crash-consistent
        connection.execute("PRAGMA busy_timeout=30000")
    except sqlite3.OperationalError as error:  # the file or its folder cannot be written: not damage
        connection.close()
        raise StoreInaccessible(f"SQLite cannot open it for writing ({error})") from None
    except sqlite3.DatabaseError as error:
        connection.close()
        raise StoreDamaged(f"SQLite cannot read it ({error})") from None
    return connection


READER_CACHE_KIB = 512


class ReaderConnections:
    """A read-only connection per thread, opened on first use, all closed by ``close``."""

    def __init__(self, path: str):
        self.path = path
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = connect(self.path)
            connection.execute("PRAGMA query_only=ON")
            # Up to one connection per pool thread (40): SQLite's default 2 MiB page cache each was 80 MB once a
            # flood of reads had touched them all; the OS caches the file's pages for all of them anyway.
            connection.execute(f"PRAGMA cache_size = -{READER_CACHE_KIB}")
            self._local.connection = connection
            with self._lock:
                self._opened.append(connection)
        return connection

    def close(self) -> None:
        with self._lock:
            for connection in self._opened:
                try:
                    connection.close()
                except sqlite3.ProgrammingError:  # owned by another thread; closes with it
                    pass
            self._opened.clear()
