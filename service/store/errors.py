"""Why the store did not take a report, or cannot open its file."""

from __future__ import annotations

import sqlite3


class StoreUnavailable(RuntimeError):
    """The store could not take or commit the report (disk full, closed, too many pending): the
    report was NOT stored; retrying after ``retry_after_s`` seconds may succeed."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreFull(RuntimeError):
    """The report would add a cluster or a rank past the store's bounds (``capacity.py``): NOT stored; it is
    taken once there is room (a cluster pruned, or the bound raised)."""

    retry_after_s = 60


class ReportNotStorable(ValueError):
    """The store cannot keep this report (its values do not fit a row): refused as invalid (422), and
    the other reports of its batch are committed without it."""


class StoreDamaged(sqlite3.DatabaseError):
    """The database file fails SQLite's integrity check, or was written by a newer capwatch."""


class StoreInaccessible(sqlite3.OperationalError):
    """SQLite cannot open the file, or cannot write it or create its write-ahead log beside it (permissions, a
    read-only folder or file system, an immutable flag): not damage, and the file is untouched."""
