"""The report-fed store on SQLite: the ``ClusterSource`` the service reads when ranks post reports.

A small facade over the store's parts, one concern each:

- ``opening.py``: the integrity check and the migrations, on open;
- ``admission.py``: which reports it takes (a bounded number pending, none once closing);
- ``loop_bridge.py``: asyncio futures in, one loop wake-up per committed batch out;
- ``writer.py``: the one writing thread, group commit (acknowledged = durable), ``ingest.py`` its transaction;
- ``rank_cache.py`` and ``checkpoints.py``: the committed rank states in memory, and on disk every few seconds;
- ``windows.py`` and ``maintenance.py``: the group windows and their folding (the advisor's rule), retention;
- ``reads.py``: what readers ask, on a connection per thread (``connections.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from capwatch.advisor.history import SampleHistory
from capwatch.service.sources.contract import IntervalPages, IntervalRow, SourceUnavailable
from capwatch.service.store import reads
from capwatch.service.store.admission import CLOSED, Admission
from capwatch.service.store.checkpoints import Checkpoints, load_ranks
from capwatch.service.store.connections import ReaderConnections, connect
from capwatch.service.store.errors import StoreUnavailable
from capwatch.service.store.file_watch import DatabaseFile
from capwatch.service.store.ingest import IngestResult
from capwatch.service.store.loop_bridge import LoopGathering
from capwatch.service.store.maintenance import Maintenance, load_folded_before
from capwatch.service.store.messages import LoopWaiter, PendingReport, ReportBatch, WriterCall
from capwatch.service.store.opening import check_integrity, migrate
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.rank_cache import RankCache
from capwatch.service.store.rank_state import ReportedRank
from capwatch.service.store.windows import FoldedHistories
from capwatch.service.store.writer import Writer, refuse
from capwatch.telemetry.report import RankReport


class Store:
    def __init__(self, path: Path | str, options: StoreOptions | None = None,
                 clock: Callable[[], float] = time.time):
        self.path = str(path)
        self.options = options or StoreOptions()
        self.clock = clock
        self._admission = Admission(self.options.max_pending_reports)
        self._gathering = LoopGathering(self._hand_over)
        self._readers = ReaderConnections(self.path)
        self._folded = FoldedHistories(self.path)
        connection = connect(self.path, create=True)
        try:
            check_integrity(connection)
            migrate(connection, self.path)
            ranks, last_report_id = load_ranks(connection, self.path)
            folded_before_s = load_folded_before(connection, clock, self.options.fold_after_s)
        except BaseException:
            connection.close()
            raise
        self._ranks = RankCache(ranks)
        checkpoints = Checkpoints(last_report_id)
        maintenance = Maintenance(self.options, clock, self._ranks, checkpoints, self._folded, folded_before_s)
        self._writer = Writer(connection, self._admission, self._ranks, checkpoints, maintenance, self.options, clock,
                              DatabaseFile(self.path))
        self._writer.start()

    # --- writes -------------------------------------------------------------------------------

    def submit(self, report: RankReport, received_unix_s: float | None = None,
               payload: bytes | None = None) -> concurrent.futures.Future:
        """Queue a validated report; the future resolves to IngestResult after COMMIT.
        ``payload``: the report's JSON as received (stored as is; saves re-serialising it)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        received = self.clock() if received_unix_s is None else received_unix_s
        refusal = self._admission.admit(ReportBatch([PendingReport(report, received, payload, future)]))
        if refusal is not None:
            future.set_exception(refusal)
        return future

    def submit_async(self, report: RankReport, received_unix_s: float | None = None,
                     payload: bytes | None = None) -> asyncio.Future:
        """``submit`` for the event loop: an asyncio future, settled with one loop wake-up per committed
        batch; the reports of one loop iteration reach the writer together (``loop_bridge.py``)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        refusal = self._admission.admit()
        if refusal is not None:
            future.set_exception(refusal)
            return future
        received = self.clock() if received_unix_s is None else received_unix_s
        self._gathering.add(loop, PendingReport(report, received, payload, LoopWaiter(loop, future)))
        return future

    def _hand_over(self, gathered: list[PendingReport]) -> None:
        if not self._admission.send(ReportBatch(gathered)):  # closed while gathering: nothing was stored
            refuse(self._admission, gathered)

    def ingest(self, report: RankReport, received_unix_s: float | None = None) -> IngestResult:
        return self.submit(report, received_unix_s).result()

    @property
    def pending_reports(self) -> int:
        """Reports submitted and not yet committed or refused (never above max_pending_reports)."""
        return self._admission.pending

    def run_in_writer(self, function: Callable[[sqlite3.Connection], object]) -> concurrent.futures.Future:
        """Run ``function`` on the writer's connection, between batches (tests, bulk loaders)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self._admission.send(WriterCall(function, future)):
            future.set_exception(StoreUnavailable(CLOSED))
        return future

    def maintain(self) -> None:
        """Fold old windows, apply retention and prune long-missing ranks now (the writer also does it
        every ``maintenance_interval_s``)."""
        self.run_in_writer(self._writer.maintenance.run).result()

    # --- reads: the ClusterSource ---------------------------------------------------------------

    def clusters(self) -> list[str]:
        return self._ranks.clusters()

    def held(self) -> tuple[int, int]:
        """How many clusters and ranks the store holds (bounded by ``max_clusters`` and ``max_ranks``)."""
        return self._ranks.counts()

    def changes(self) -> Store:
        """The store versions its clusters (``ClusterChanges``: ``generation`` and ``changed_since`` below)."""
        return self

    def generation(self, cluster: str) -> int:
        """Changes whenever the cluster's committed data does (reports, folds, pruning)."""
        return self._ranks.generation(cluster)

    def changed_since(self, mark: int) -> tuple[int, list[str]]:
        """The clusters whose committed data changed after ``mark``, and the next mark (``RankCache``)."""
        return self._ranks.changed_since(mark)

    def rank_states(self, cluster: str) -> list[ReportedRank]:
        """Committed states (published only after COMMIT; never mutated once published)."""
        return self._ranks.cluster_states(cluster)

    @property
    def lost(self) -> str | None:
        """What happened to the database file under the service (``file_watch.py``); None while it is intact."""
        return self._admission.lost

    def _intact(self) -> None:
        """Reads that need the file: refused (503) once it is lost, rather than read from another file."""
        if self._admission.lost is not None:
            raise SourceUnavailable(f"the database cannot be read: {self._admission.lost}; restore it or restart "
                                    "the service")

    def sample_history(self, cluster: str, role: str) -> SampleHistory:
        self._intact()
        return reads.sample_history(self._reader(), self._folded, cluster, role, self.options.policy,
                                    self.options.window_s)

    def interval_rows(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                      limit: int) -> list[IntervalRow]:
        self._intact()
        return reads.interval_rows(self._reader(), cluster, role, since_unix_s, until_unix_s, limit)

    def interval_pages(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float, limit: int,
                       orders: tuple[str, ...], page_rows: int = 2000) -> IntervalPages:
        self._intact()
        return reads.interval_pages(self._reader, cluster, role, since_unix_s, until_unix_s, limit, orders, page_rows)

    def report_count(self) -> int:
        return reads.report_count(self._reader())

    def report_keys(self) -> set[tuple[str, str, int, str, int]]:
        return reads.report_keys(self._reader())

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection (tests read the tables through it)."""
        return self._readers.get()

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        if not self._admission.close():
            return
        self._writer.join(timeout=30)
        self._readers.close()
