"""Opening a database file: SQLite's integrity check, then the migrations up to ``SCHEMA_VERSION``."""

from __future__ import annotations

import logging
import sqlite3

from capwatch.service.store.errors import StoreDamaged
from capwatch.service.store.schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger(__name__)


def check_integrity(connection: sqlite3.Connection) -> None:
    """``PRAGMA quick_check`` (every page's structure, O(file), no index cross-check): damage
    anywhere in the file fails here, at start, instead of as errors on reads and acknowledged
    writes into a broken file later."""
    try:
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(5)")]
    except sqlite3.DatabaseError as error:  # not a database at all (a damaged header)
        raise StoreDamaged(f"SQLite cannot read it ({error})") from None
    if problems != ["ok"]:
        summary = " ".join("; ".join(str(problem) for problem in problems).split())  # one line
        raise StoreDamaged(f"SQLite's integrity check fails ({summary[:300]})")


def migrate(connection: sqlite3.Connection, path: str) -> None:
    """Each migration in its own transaction that also sets the version (see schema.py)."""
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreDamaged(f"it has schema version {version}, written by a newer capwatch (this one reads up "
                           f"to {SCHEMA_VERSION})")
    for target, script in enumerate(MIGRATIONS[version:], start=version + 1):
        connection.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {target};\nCOMMIT;")
        log.info("database %s migrated to schema version %d", path, target)
