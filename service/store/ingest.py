"""One batch of new reports, committed in one transaction: find which are already stored, insert the new
ones, grow their windows, COMMIT. Written with a few statements of many rows each (see schema.py for why)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from capwatch.advisor.sample import RankInterval
from capwatch.service.store.messages import PendingReport
from capwatch.service.store.rank_cache import RankCache, RankKey
from capwatch.service.store.rank_state import ReportedRank, apply_report
from capwatch.service.store.schema import (REPORT_KEY_COLUMNS, existing_reports_sql, insert_reports_sql,
                                            upsert_windows_sql)
from capwatch.service.store.windows import rank_interval, window_row


@dataclass(frozen=True)
class IngestResult:
    accepted: bool
    duplicate: bool


ACCEPTED = IngestResult(accepted=True, duplicate=False)
DUPLICATE = IngestResult(accepted=True, duplicate=True)
_KEY_LENGTH = len(REPORT_KEY_COLUMNS)
_ROWS_PER_STATEMENT = 512  # 512 x 13 parameters stays well under SQLite's limit of 32,766


@dataclass(frozen=True)
class CommittedBatch:
    results: list[IngestResult]  # one per report of the batch, in its order
    ranks: dict[RankKey, ReportedRank]  # the new states of the ranks the batch changed (copies, not yet published)
    last_report_id: int


def _chunks(rows: list) -> list[list]:
    return [rows[start:start + _ROWS_PER_STATEMENT] for start in range(0, len(rows), _ROWS_PER_STATEMENT)]


def _flat(rows: list[tuple]) -> list:
    return [value for row in rows for value in row]


def _stored_keys(connection: sqlite3.Connection, keys: list[tuple]) -> set[tuple]:
    stored: set[tuple] = set()
    for chunk in _chunks(keys):
        stored.update(connection.execute(existing_reports_sql(len(chunk)), _flat(chunk)))
    return stored


def commit_batch(connection: sqlite3.Connection, batch: list[PendingReport], ranks: RankCache, window_s: float,
                 folded_before_s: float, last_report_id: int) -> CommittedBatch:
    """Commit ``batch``; on any error, ROLLBACK and raise it (nothing changed, nothing settled)."""
    touched: dict[RankKey, ReportedRank] = {}
    try:
        intervals = [rank_interval(pending.report) for pending in batch]
        report_rows = [_report_row(pending, interval) for pending, interval in zip(batch, intervals)]
        connection.execute("BEGIN IMMEDIATE")
        seen = _stored_keys(connection, [row[:_KEY_LENGTH] for row in report_rows])
        rows, window_rows, results = [], [], []
        for row, pending, interval in zip(report_rows, batch, intervals):
            key = row[:_KEY_LENGTH]
            if key in seen:  # stored before, or earlier in this batch
                results.append(DUPLICATE)
                continue
            seen.add(key)
            results.append(ACCEPTED)
            rows.append(row)
            window = window_row(key[0], key[1], interval, window_s, folded_before_s)
            if window is not None:
                window_rows.append(window)
            rank = key[:3]
            state = touched.get(rank) or ranks.copy_of(rank)
            touched[rank] = apply_report(state, pending.report, pending.received_unix_s)
        for chunk in _chunks(rows):
            last_report_id = connection.execute(insert_reports_sql(len(chunk)), _flat(chunk)).lastrowid
        for chunk in _chunks(window_rows):
            connection.execute(upsert_windows_sql(len(chunk)), _flat(chunk))
        connection.execute("COMMIT")
    except Exception:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return CommittedBatch(results, touched, last_report_id)


def _report_row(pending: PendingReport, interval: RankInterval) -> tuple:
    """The report's ``reports`` row, in REPORT_COLUMNS order (its key first)."""
    report, payload = pending.report, pending.payload
    identity = report.identity
    return (identity.cluster, identity.role, identity.ep_rank, identity.boot_id, report.sequence,
            pending.received_unix_s, interval.end_unix_s, interval.peak_runtime_tokens, interval.cap,
            interval.forward_steps, interval.overflow_events,
            payload.decode() if payload is not None else report.model_dump_json(), report.interval.max_local_tokens)
