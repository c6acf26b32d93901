"""What the writer does every ``maintenance_interval_s``, in one transaction: windows older than
``fold_after_s`` are handed to the advisor's folding (``advisor/folding.py``) and the history it returns
replaces them; reports older than ``retention_s`` are deleted, and ranks silent that long are pruned."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from capwatch.advisor.folding import fold
from capwatch.service.store.checkpoints import Checkpoints
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.rank_cache import RankCache
from capwatch.service.store.windows import FoldedHistories, read_windows

log = logging.getLogger(__name__)


def load_folded_before(connection: sqlite3.Connection, clock: Callable[[], float], fold_after_s: float) -> float:
    """Every window that started before this has been folded (a late report for one adds no row)."""
    row = connection.execute("SELECT folded_before_s FROM fold_progress WHERE id = 0").fetchone()
    if row is not None:
        return row[0]
    if connection.execute("SELECT 1 FROM folded LIMIT 1").fetchone() is None:
        return float("-inf")  # nothing folded yet
    return clock() - fold_after_s  # folded before this table existed: assume current


class Maintenance:
    def __init__(self, options: StoreOptions, clock: Callable[[], float], ranks: RankCache,
                 checkpoints: Checkpoints, folded: FoldedHistories, folded_before_s: float):
        self.options = options
        self.clock = clock
        self.ranks = ranks
        self.checkpoints = checkpoints
        self.folded = folded
        self.folded_before_s = folded_before_s  # the writer's: ingest reads it between batches

    def run(self, connection: sqlite3.Connection) -> None:
        options = self.options
        now = self.clock()
        fold_before = now - options.fold_after_s
        retained_after = now - options.retention_s
        connection.execute("BEGIN IMMEDIATE")
        try:
            groups = connection.execute(
                "SELECT DISTINCT cluster, role FROM windows WHERE window_start_s < ?", (fold_before,)).fetchall()
            for cluster, role in groups:
                history = fold(self.folded.read(connection, cluster, role),
                               read_windows(connection, cluster, role, before_s=fold_before),
                               options.policy, options.window_s, now)
                self.folded.write(connection, cluster, role, history)
                connection.execute("DELETE FROM windows WHERE cluster = ? AND role = ? AND window_start_s < ?",
                                   (cluster, role, fold_before))
            # Ids grow with arrival, so the rows past retention are a prefix of the id order: find its
            # end by walking from the start (cost ~ rows deleted) instead of indexing received time.
            connection.execute(
                "DELETE FROM reports WHERE id < coalesce((SELECT id FROM reports WHERE received_unix_s >= ? "
                "ORDER BY id LIMIT 1), (SELECT max(id) + 1 FROM reports))", (retained_after,))
            # A rank silent for longer than the retention has no report left: it is gone, not missing.
            gone = self.ranks.silent_since(retained_after)
            connection.execute("DELETE FROM ranks WHERE received_unix_s < ?", (retained_after,))
            folded_before = max(self.folded_before_s, fold_before)  # a clock stepping back folds no less
            connection.execute("INSERT OR REPLACE INTO fold_progress (id, folded_before_s) VALUES (0, ?)",
                               (folded_before,))
            connection.execute("COMMIT")
        except Exception:
            connection.execute("ROLLBACK")
            raise
        self.folded_before_s = folded_before
        if gone:
            self.ranks.forget(gone)
            self.checkpoints.forgotten(gone)
            log.info("pruned %d rank(s) silent for longer than the retention (%.0f s)", len(gone),
                     options.retention_s)
        self.ranks.changed(cluster for cluster, _ in groups)  # a fold changes the clusters' history
