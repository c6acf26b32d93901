"""What readers ask of the database, each on the calling thread's own connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator

from capwatch.advisor.folding import history_of
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.service.sources.contract import IntervalPages, IntervalRow, interval_rows_of
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
    rows.reverse()
    return interval_rows_of(rows)


_ROW = ("ep_rank, interval_end_unix_s, peak_runtime_tokens, cap, forward_steps, overflow_events, max_local_tokens, "
        "id")
_IN_RANGE = "cluster = ? AND role = ? AND interval_end_unix_s >= ? AND interval_end_unix_s <= ? AND id <= ?"
# After each page, the next starts past the last row: by rank, time and id, or by time and id.
_NEXT = {"rank": ("(ep_rank, interval_end_unix_s, id) > (?, ?, ?)", "ep_rank, interval_end_unix_s, id"),
         "time": ("(interval_end_unix_s, id) > (?, ?)", "interval_end_unix_s, id")}


def interval_pages(reader: Callable[[], sqlite3.Connection], cluster: str, role: str, since_unix_s: float,
                   until_unix_s: float, limit: int, orders: tuple[str, ...], page_rows: int) -> IntervalPages:
    """The rows ``interval_rows`` gives, once per order asked for, in pages of at most ``page_rows``, ordered by
    rank then time (``"rank"``) or by time (``"time"``): a reader that streams them holds one page. Each page is
    its own short query on the calling thread's connection (``reader``), so a slow consumer holds no transaction
    open; which rows (the newest ``limit``, up to the newest id) is fixed now. Also whether ``limit`` left some
    out."""
    connection = reader()
    (newest_id,) = connection.execute("SELECT coalesce(max(id), 0) FROM reports").fetchone()
    bounds = (cluster, role, since_unix_s, until_unix_s, newest_id)
    oldest_kept = connection.execute(  # the limit-th newest row: where the kept rows begin
        f"SELECT interval_end_unix_s, id FROM reports WHERE {_IN_RANGE} ORDER BY interval_end_unix_s DESC, id DESC "
        "LIMIT 1 OFFSET ?", (*bounds, limit - 1)).fetchone()
    kept, kept_parameters = ("", ()) if oldest_kept is None else (" AND (interval_end_unix_s, id) >= (?, ?)",
                                                                   tuple(oldest_kept))

    def pages(order: str) -> Iterator[list[IntervalRow]]:
        after, columns = _NEXT[order]
        last: tuple = ()
        lowest_end = since_unix_s if oldest_kept is None else max(since_unix_s, oldest_kept[0])
        while True:
            query = (f"SELECT {_ROW} FROM reports WHERE {_IN_RANGE}{kept}" + (f" AND {after}" if last else "") +
                     f" ORDER BY {columns} LIMIT ?")
            # By time, the page's lowest end is the index range's start (SQLite does not take it from the row
            # values): each page is then a seek, not a scan from since_s (a 100,000-row answer's pages took O(n^2)).
            low = max(lowest_end, last[0]) if order == "time" and last else lowest_end
            rows = reader().execute(query, (cluster, role, low, *bounds[3:], *kept_parameters, *last,
                                            page_rows)).fetchall()
            if not rows:
                return
            more, end = len(rows) == page_rows, rows[-1]
            last = (end[0], end[1], end[-1]) if order == "rank" else (end[1], end[-1])
            page = [interval_rows_of(rows)]
            del rows
            yield page.pop()  # held by the consumer alone while this waits (a slow client holds one page)
            if not more:
                return

    return oldest_kept is not None, [pages(order) for order in orders]


def report_count(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT count(*) FROM reports").fetchone()[0]


def report_keys(connection: sqlite3.Connection) -> set[tuple[str, str, int, str, int]]:
    return set(connection.execute("SELECT cluster, role, ep_rank, boot_id, sequence FROM reports"))
