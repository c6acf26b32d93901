"""The store's side of the group windows: each new report adds its interval to its window's row (by the
window rule, ``advisor/sample.py``; the SQL is ``schema.upsert_windows_sql``), and the rows and the folded
history are read back as the advisor's types. What the windows become in the history is the advisor's
(``advisor/folding.py``); this module only moves rows."""

from __future__ import annotations

import json
import logging
import sqlite3

from capwatch.advisor.history import SampleHistory
from capwatch.advisor.sample import (WINDOW_FIELDS, GroupSample, RankInterval, ran_steps, sample_of,
                                             window_start, window_values)
from capwatch.telemetry.report import MAX_STORED_COUNT, RankReport

log = logging.getLogger(__name__)

_WINDOW_SELECT = "SELECT window_start_s, " + ", ".join(rule.name for rule in WINDOW_FIELDS) + " FROM windows "


def runtime_overflows(report: RankReport) -> int:
    """The interval's runtime_over_cap events, every outcome (saturating: a stored count fits int64)."""
    total = sum(event.count for event in report.interval.overflow_events if event.kind == "runtime_over_cap")
    return min(total, MAX_STORED_COUNT)


def rank_interval(report: RankReport) -> RankInterval:
    """A report's interval as the window rule reads it."""
    interval = report.interval
    return RankInterval(report.identity.ep_rank, interval.end_unix_s, interval.peak_runtime_tokens, report.config.cap,
                        runtime_overflows(report), interval.forward_steps)


def window_row(cluster: str, role: str, interval: RankInterval, window_s: float, folded_before_s: float) -> tuple | None:
    """The row ``schema.upsert_windows_sql`` adds for an interval (1: one more report in the window), or
    None: an idle interval adds nothing, and a window already folded into the history has had its one
    sample (a row for it would be folded again as a second sample), so a late report for it is kept
    raw (audit, dedupe) but adds no row."""
    if not ran_steps(interval.forward_steps):
        return None
    start = window_start(interval.end_unix_s, window_s)
    if start < folded_before_s:
        return None
    return (cluster, role, start, *window_values(interval), 1)


def read_windows(connection: sqlite3.Connection, cluster: str, role: str,
                 before_s: float = float("inf")) -> list[GroupSample]:
    """The group's window rows that started before ``before_s``, oldest first."""
    rows = connection.execute(_WINDOW_SELECT + "WHERE cluster = ? AND role = ? AND window_start_s < ? "
                              "ORDER BY window_start_s", (cluster, role, before_s)).fetchall()
    return [sample_of(row[0], row[1:]) for row in rows]


class FoldedHistories:
    """The folded history of each group, as JSON (``SampleHistory.to_dict``)."""

    def __init__(self, path: str):
        self.path = path
        self._unreadable: set[tuple[str, str]] = set()

    def read(self, connection: sqlite3.Connection, cluster: str, role: str) -> SampleHistory | None:
        """None: nothing folded yet, or a history that cannot be read (reported once per group; the
        advice then uses the recent windows only, until the next fold rewrites it)."""
        row = connection.execute("SELECT history FROM folded WHERE cluster = ? AND role = ?",
                                 (cluster, role)).fetchone()
        if row is None:
            return None
        try:
            return SampleHistory.from_dict(json.loads(row[0]))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            if (cluster, role) not in self._unreadable:  # reported once, not per request
                self._unreadable.add((cluster, role))
                log.warning("database %s: the folded history of %s/%s cannot be read (%s); the advice uses the "
                            "recent windows only until the next fold rewrites it", self.path, cluster, role, error)
            return None

    @staticmethod
    def write(connection: sqlite3.Connection, cluster: str, role: str, history: SampleHistory) -> None:
        connection.execute("INSERT OR REPLACE INTO folded (cluster, role, history) VALUES (?, ?, ?)",
                           (cluster, role, json.dumps(history.to_dict())))
