"""The one thread that writes, with group commit.

Acknowledgement means durable: a report's waiter is settled only after the transaction holding it has
COMMITted (``synchronous=FULL``, WAL), so a SIGKILL or a power cut after the 202 cannot lose it. While one
transaction's fsync runs, new reports queue up and the next transaction takes them all (up to
``max_batch_reports``), so durability costs one fsync per batch, not per report. Between batches the
writer runs the calls queued for it, checkpoints the changed ranks, and runs the maintenance.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable

from capwatch.service.store.admission import CLOSED, Admission, lost_message
from capwatch.service.store.capacity import within_bounds
from capwatch.service.store.checkpoints import Checkpoints
from capwatch.service.store.errors import ReportNotStorable, StoreUnavailable
from capwatch.service.store.file_watch import DatabaseFile
from capwatch.service.store.ingest import commit_batch
from capwatch.service.store.loop_bridge import settle
from capwatch.service.store.maintenance import Maintenance
from capwatch.service.store.messages import PendingReport, ReportBatch, StopWriter, WriterCall, WriterMessage
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.rank_cache import RankCache

log = logging.getLogger(__name__)
FILE_CHECK_S = 1.0  # how often the idle writer looks at its database file (before every commit too)


def refuse(admission: Admission, batch: list[PendingReport]) -> None:
    """Settle reports that will never be written: the store closed before they reached a transaction."""
    admission.settled(len(batch))
    settle(batch, None, StoreUnavailable(CLOSED))


class Writer:
    def __init__(self, connection: sqlite3.Connection, admission: Admission, ranks: RankCache,
                 checkpoints: Checkpoints, maintenance: Maintenance, options: StoreOptions,
                 clock: Callable[[], float], database_file: DatabaseFile):
        self.connection = connection
        self.database_file = database_file
        self.admission = admission
        self.ranks = ranks
        self.checkpoints = checkpoints
        self.maintenance = maintenance
        self.options = options
        self.clock = clock
        self._thread = threading.Thread(target=self._run, name="capwatch-store-writer", daemon=True)
        self._full_logged_at, self._refused_full = float("-inf"), 0

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)

    def _next_batch(self, carried: list[PendingReport]) -> tuple[list[PendingReport], list[WriterCall], list, bool]:
        """What is queued now, waiting up to the next timer for the first message: (reports to commit, at
        most max_batch_reports; calls; reports carried to the next batch; whether to stop after it)."""
        options = self.options
        message: WriterMessage | None
        if carried:
            message, carried = ReportBatch(carried), []
        else:
            try:
                message = self.admission.queue.get(timeout=min(options.maintenance_interval_s,
                                                               options.checkpoint_interval_s, FILE_CHECK_S))
            except queue.Empty:
                message = None
        batch: list[PendingReport] = []
        calls: list[WriterCall] = []
        stopping = False
        while message is not None:
            match message:
                case StopWriter():
                    stopping = True
                case ReportBatch(reports=reports):
                    room = options.max_batch_reports - len(batch)
                    batch.extend(reports[:room])
                    carried = reports[room:]
                case WriterCall():
                    calls.append(message)
            if stopping or carried or len(batch) >= options.max_batch_reports:
                break
            try:
                message = self.admission.queue.get_nowait()
            except queue.Empty:
                message = None
        return batch, calls, carried, stopping

    def _run(self) -> None:
        connection = self.connection
        next_maintenance = self.clock() + self.options.maintenance_interval_s
        next_checkpoint = time.monotonic() + self.options.checkpoint_interval_s
        stopping = False
        carried: list[PendingReport] = []  # reports that did not fit in the previous batch
        while not stopping:
            batch, calls, carried, stopping = self._next_batch(carried)
            if self._file_lost():  # every report, this batch's included, is refused: none goes to a lost file
                self._refuse_lost(batch + carried)
                batch, carried = [], []
            if batch:
                batch = self._within_bounds(batch)
            if batch:
                self._commit(batch)
            for call in calls:
                try:
                    call.future.set_result(call.function(connection))
                except Exception as error:  # surfaced to the caller, the writer keeps going
                    call.future.set_exception(error)
            if self.admission.lost is not None:
                continue  # nothing more is written to a file that is not the one opened
            if stopping or time.monotonic() >= next_checkpoint:
                try:
                    self.checkpoints.write(connection, self.ranks)
                except Exception:
                    log.exception("rank state checkpoint failed; the reports replay on start")
                next_checkpoint = time.monotonic() + self.options.checkpoint_interval_s
            if self.clock() >= next_maintenance:
                try:
                    self.maintenance.run(connection)
                except Exception:
                    log.exception("store maintenance failed; will retry")
                next_maintenance = self.clock() + self.options.maintenance_interval_s
        self._fail_leftovers(carried)
        connection.close()

    def _fail_leftovers(self, carried: list[PendingReport]) -> None:
        """After the stop message: refuse whatever is still queued, so no request waits forever.
        (Admission puts nothing after it; this also covers a batch cut off by it.)"""
        leftovers = list(carried)
        while True:
            try:
                message = self.admission.queue.get_nowait()
            except queue.Empty:
                break
            match message:
                case ReportBatch(reports=reports):
                    leftovers.extend(reports)
                case WriterCall(future=future):
                    future.set_exception(StoreUnavailable(CLOSED))
        if leftovers:
            refuse(self.admission, leftovers)

    def _file_lost(self) -> bool:
        """Whether the database file was lost (``file_watch.py``); said in the log once, when noticed."""
        if self.admission.lost is not None:
            return True
        problem = self.database_file.problem()
        if problem is None:
            return False
        self.admission.lose(problem)
        log.error("the database %s: %s. Reports are refused from now on (503) so that none is acknowledged into a "
                  "file that is gone or cannot be kept, and reads that need the file answer 503; every report "
                  "acknowledged before this is in that file. Restore it, or restart the service (a deleted database "
                  "starts empty)", self.database_file.path, problem)
        if self.database_file.moved_away():
            copy = self.database_file.set_aside(self.connection)
            if copy is not None:
                log.error("every report this service acknowledged is kept in %s, and the write-ahead log it left "
                          "at %s-wal is set aside (*.lost-*), so the file now at %s starts as it is. To serve what "
                          "it held: capwatch serve --db %s", copy, self.database_file.path, self.database_file.path,
                          copy)
        return True

    def _refuse_lost(self, reports: list[PendingReport]) -> None:
        if reports:
            self.admission.settled(len(reports))
            settle(reports, None, StoreUnavailable(lost_message(self.admission.lost), retry_after_s=60))

    def _within_bounds(self, batch: list[PendingReport]) -> list[PendingReport]:
        """The reports there is room for (``capacity.py``); the others refused now, logged at most once a minute."""
        taken, refused = within_bounds(batch, self.ranks, self.options.max_clusters, self.options.max_ranks)
        if refused:
            self.admission.settled(len(refused))
            settle([pending for pending, _ in refused], None, [error for _, error in refused])
            self._refused_full += len(refused)
            if time.monotonic() - self._full_logged_at >= 60.0:
                log.warning("%s (%d report(s) refused since the last line)", refused[0][1], self._refused_full)
                self._full_logged_at, self._refused_full = time.monotonic(), 0
        return taken

    def _commit(self, batch: list[PendingReport]) -> None:
        """Commit the batch; if that fails for a reason other than the disk, find the reports that cannot
        be stored by committing halves, so a bad row never fails the other reports of its batch."""
        try:
            committed = commit_batch(self.connection, batch, self.ranks, self.options.window_s,
                                     self.maintenance.folded_before_s, self.checkpoints.last_report_id)
        except Exception as error:
            if isinstance(error, sqlite3.OperationalError) or len(batch) == 1:
                # The disk (full, read-only, locked): no subset would do better. Or this one report is the cause.
                log.error("commit of %d report(s) failed: %s", len(batch), error)
                refusal = (StoreUnavailable(f"the report was not stored: {error}")
                           if isinstance(error, sqlite3.OperationalError)
                           else ReportNotStorable(f"the store cannot keep this report: {error}"))
                self.admission.settled(len(batch))
                settle(batch, None, refusal)
                return
            middle = len(batch) // 2
            self._commit(batch[:middle])
            self._commit(batch[middle:])
            return
        self.ranks.publish(committed.ranks)
        self.checkpoints.committed(committed.ranks, committed.last_report_id)
        self.admission.settled(len(batch))  # before the waiters wake: an acknowledged report is no longer pending
        settle(batch, committed.results, None)
