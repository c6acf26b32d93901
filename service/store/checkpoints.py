"""Rank states are derived from the reports: checkpointed every few seconds (the ranks changed since),
and on start the reports after the checkpoint are replayed, so a batch commit does not re-serialise
every rank it touched."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable

from capwatch.service.store.rank_cache import RankCache, RankKey
from capwatch.service.store.rank_state import ReportedRank, apply_report
from capwatch.telemetry.report import RankReport

log = logging.getLogger(__name__)


def write_checkpoint(connection: sqlite3.Connection, ranks: dict[RankKey, ReportedRank],
                     last_report_id: int) -> None:
    connection.execute("BEGIN IMMEDIATE")
    connection.executemany(
        "INSERT OR REPLACE INTO ranks (cluster, role, ep_rank, state, received_unix_s) VALUES (?, ?, ?, ?, ?)",
        [(key[0], key[1], key[2], json.dumps(state.to_dict()), state.received_unix_s) for key, state in ranks.items()])
    connection.execute("INSERT OR REPLACE INTO checkpoint (id, last_report_id) VALUES (0, ?)", (last_report_id,))
    connection.execute("COMMIT")


def load_ranks(connection: sqlite3.Connection, path: str) -> tuple[dict[RankKey, ReportedRank], int]:
    """The checkpointed rank states, brought up to date by replaying the reports after it, and the last
    report id replayed. A state row the code cannot read is reported (logged) and rebuilt from the
    retained reports."""
    ranks: dict[RankKey, ReportedRank] = {}
    unreadable = 0
    for cluster, role, ep_rank, text in connection.execute("SELECT cluster, role, ep_rank, state FROM ranks"):
        try:
            ranks[(cluster, role, ep_rank)] = ReportedRank.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError) as error:  # bad JSON, not a state, or one the model refuses
            unreadable += 1
            log.warning("database %s: the state of rank %s/%s/%s cannot be read (%s); rebuilding the ranks from "
                        "the reports kept", path, cluster, role, ep_rank, str(error).splitlines()[0])
    row = connection.execute("SELECT last_report_id FROM checkpoint WHERE id = 0").fetchone()
    checkpoint = 0 if unreadable or row is None else row[0]
    if unreadable:
        ranks = {}  # replay everything retained: a partial state would double-count the rest
    last = checkpoint
    for report_id, payload, received in connection.execute(
            "SELECT id, payload, received_unix_s FROM reports WHERE id > ? ORDER BY id", (checkpoint,)):
        last = report_id
        try:
            report = RankReport.model_validate_json(payload)
        except ValueError as error:
            log.warning("database %s: report row %d cannot be read (%s); skipped", path, report_id,
                        str(error).splitlines()[0])
            continue
        key = (report.identity.cluster, report.identity.role, report.identity.ep_rank)
        ranks[key] = apply_report(ranks.get(key), report, received)
    if last != checkpoint or unreadable:
        if unreadable:
            connection.execute("DELETE FROM ranks")
        write_checkpoint(connection, ranks, last)
    return ranks, last


class Checkpoints:
    """Which ranks changed since the last checkpoint, and up to which report (the writer's alone)."""

    def __init__(self, last_report_id: int):
        self.last_report_id = last_report_id
        self._dirty: set[RankKey] = set()

    def committed(self, ranks: Iterable[RankKey], last_report_id: int) -> None:
        self._dirty.update(ranks)
        self.last_report_id = last_report_id

    def forgotten(self, ranks: Iterable[RankKey]) -> None:
        self._dirty.difference_update(ranks)

    def write(self, connection: sqlite3.Connection, cache: RankCache) -> None:
        if self._dirty:
            write_checkpoint(connection, cache.states(self._dirty), self.last_report_id)
            self._dirty.clear()
