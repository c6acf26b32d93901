"""What readers ask of the database, each on the calling thread's own connection."""

from __future__ import annotations

import sqlite3

from capwatch.service.advisor.folding import history_of
from capwatch.service.advisor.history import SampleHistory
from capwatch.service.advisor.policy import AdvisorPolicy
from capwatch.service.sources.contract import IntervalRow
from capwatch.service.store.windows import FoldedHistories, read_windows


def sample_history(connection: sqlite3.Connection, folded: FoldedHistories, cluster: str, role: str,
                   policy: AdvisorPolicy, window_s: float) -> SampleHistory:
    """The folded history and the windows not yet folded, read in one snapshot (a fold between the two
    reads cannot double-count), made into the group's history by the advisor."""
    connection.execute("BEGIN")
    try:
        history = folded.read(connection, cluster, role)
        windows = read_windows(connection, cluster, role)
    finally:
        connection.execute("COMMIT")
    return history_of(history, windows, policy, window_s)


def interval_rows(connection: sqlite3.Connection, cluster: str, role: str, since_unix_s: float,
                  until_unix_s: float, limit: int) -> list[IntervalRow]:
    """The newest ``limit`` reports' intervals ending in [since, until], oldest first."""
    rows = connection.execute(
        "SELECT ep_rank, interval_end_unix_s, peak_runtime_tokens, cap, forward_steps, overflow_events, "
        "max_local_tokens FROM reports WHERE cluster = ? AND role = ? AND interval_end_unix_s >= ? "
        "AND interval_end_unix_s <= ? ORDER BY interval_end_unix_s DESC LIMIT ?",
        (cluster, role, since_unix_s, until_unix_s, limit)).fetchall()
    return [IntervalRow(*row) for row in reversed(rows)]


def report_count(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT count(*) FROM reports").fetchone()[0]


def report_keys(connection: sqlite3.Connection) -> set[tuple[str, str, int, str, int]]:
    return set(connection.execute("SELECT cluster, role, ep_rank, boot_id, sequence FROM reports"))
