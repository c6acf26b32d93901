"""The SQLite store with group commit.

Acknowledgement means durable: the HTTP handler waits until the transaction holding its
report has COMMITted with ``synchronous=FULL`` in WAL mode, so a SIGKILL (or a power cut)
after the 202 cannot lose it. One writer thread owns the write connection; while one
transaction's fsync runs, new reports queue up and the next transaction takes them all, so
durability costs one fsync per batch, not per report. Readers use their own connections
(WAL lets them read while the writer writes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from capwatch.service.advisor.history import SampleHistory
from capwatch.service.advisor.policy import AdvisorPolicy
from capwatch.service.advisor.sample import RankInterval, ran_steps, sample_of, window_start, window_values
from capwatch.service.sources.contract import IntervalRow
from capwatch.service.store.rank_state import ReportedRank, apply_report
from capwatch.service.store.schema import (MIGRATIONS, REPORT_COLUMNS, REPORT_KEY_COLUMNS, SCHEMA_VERSION,
                                            WINDOW_COLUMNS, existing_reports_sql, insert_reports_sql,
                                            upsert_windows_sql)
from capwatch.telemetry.report import MAX_STORED_COUNT, RankReport

log = logging.getLogger(__name__)
RankKey = tuple[str, str, int]  # cluster, role, ep_rank


@dataclass(frozen=True)
class IngestResult:
    accepted: bool
    duplicate: bool


@dataclass(frozen=True)
class StoreOptions:
    window_s: float = 60.0
    fold_after_s: float = 6 * 3600.0
    retention_s: float = 2 * 86_400.0
    maintenance_interval_s: float = 30.0
    max_batch_reports: int = 1024
    # Reports accepted but not yet committed; past it, submits are refused (503 + Retry-After) so an
    # overload costs retries with backoff instead of memory and latency without limit. 32 batches:
    # about a second of writer work, and room for a bulk loader (benchmarks/advice_latency.py keeps
    # ~21k in flight).
    max_pending_reports: int = 32 * 1024
    checkpoint_interval_s: float = 10.0  # a checkpoint re-serialises every changed rank: not too often
    policy: AdvisorPolicy = AdvisorPolicy()


@dataclass(frozen=True)
class _LoopWaiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


Waiter = concurrent.futures.Future | _LoopWaiter


# --- the writer's messages: what the queue carries, told apart by type --------------------------


@dataclass(frozen=True)
class PendingReport:
    """One validated report waiting for its commit, and who waits for the acknowledgement."""

    report: RankReport
    received_unix_s: float
    payload: bytes | None  # the JSON as received, stored as is
    waiter: Waiter


@dataclass(frozen=True)
class ReportBatch:
    """Reports to commit together: one ``submit``, or one event-loop iteration's ``submit_async`` calls."""

    reports: list[PendingReport]


@dataclass(frozen=True)
class WriterCall:
    """A function to run on the writer's connection, between batches."""

    function: Callable[[sqlite3.Connection], object]
    future: concurrent.futures.Future


@dataclass(frozen=True)
class StopWriter:
    """Sent once, by ``close``: commit what came before, refuse what comes after."""


WriterMessage = ReportBatch | WriterCall | StopWriter


def _settle(outcomes: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue  # the client went away; the report is stored all the same
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _resolve(batch: list[PendingReport], results: list | None, error: BaseException | list | None) -> None:
    """Settle every waiter of a batch: concurrent futures directly, asyncio futures per loop in one call.
    ``error``: one for the whole batch, or one (or None) per report."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for index, pending in enumerate(batch):
        result = results[index] if results is not None else None
        waiter = pending.waiter
        failure = error[index] if isinstance(error, list) else error
        if failure is not None:
            result = None
        if isinstance(waiter, _LoopWaiter):
            by_loop.setdefault(waiter.loop, []).append((waiter.future, result, failure))
        elif failure is not None:
            waiter.set_exception(failure)
        else:
            waiter.set_result(result)
    for loop, outcomes in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, outcomes)
        except RuntimeError:  # that loop has closed: nobody is waiting any more
            pass


class StoreUnavailable(RuntimeError):
    """The store could not take or commit the report (disk full, closed, too many pending): the
    report was NOT stored; retrying after ``retry_after_s`` seconds may succeed."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ReportNotStorable(ValueError):
    """The store cannot keep this report (its values do not fit a row): refused as invalid (422), and
    the other reports of its batch are committed without it."""


class StoreDamaged(sqlite3.DatabaseError):
    """The database file fails SQLite's integrity check, or was written by a newer capwatch."""


def _runtime_overflows(report: RankReport) -> int:
    total = sum(event.count for event in report.interval.overflow_events if event.kind == "runtime_over_cap")
    return min(total, MAX_STORED_COUNT)


_ACCEPTED = IngestResult(accepted=True, duplicate=False)
_DUPLICATE = IngestResult(accepted=True, duplicate=True)
_KEY_LENGTH = len(REPORT_KEY_COLUMNS)
_OVERFLOW_EVENTS = REPORT_COLUMNS.index("overflow_events")
_WINDOW_SELECT = f"SELECT {', '.join(WINDOW_COLUMNS[2:])} FROM windows "
_ROWS_PER_STATEMENT = 512  # 512 x 13 parameters stays well under SQLite's limit of 32,766


def _report_row(report: RankReport, received: float, payload: bytes | None) -> tuple:
    """The report's ``reports`` row, in REPORT_COLUMNS order (its key first)."""
    identity, interval = report.identity, report.interval
    return (identity.cluster, identity.role, identity.ep_rank, identity.boot_id, report.sequence, received,
            interval.end_unix_s, interval.peak_runtime_tokens, report.config.cap, interval.forward_steps,
            _runtime_overflows(report), payload.decode() if payload is not None else report.model_dump_json(),
            interval.max_local_tokens)


def _chunks(rows: list) -> list[list]:
    return [rows[start:start + _ROWS_PER_STATEMENT] for start in range(0, len(rows), _ROWS_PER_STATEMENT)]


def _flat(rows: list[tuple]) -> list:
    return [value for row in rows for value in row]


def _stored_keys(connection: sqlite3.Connection, keys: list[tuple]) -> set[tuple]:
    stored: set[tuple] = set()
    for chunk in _chunks(keys):
        stored.update(connection.execute(existing_reports_sql(len(chunk)), _flat(chunk)))
    return stored


class Store:
    def __init__(self, path: Path | str, options: StoreOptions | None = None,
                 clock: Callable[[], float] = time.time):
        self.path = str(path)
        self.options = options or StoreOptions()
        self.clock = clock
        self._gathering: dict[asyncio.AbstractEventLoop, list[PendingReport]] = {}  # per loop, touched by it only
        self._queue: queue.SimpleQueue[WriterMessage] = queue.SimpleQueue()  # C: put costs the HTTP loop far less
        # Guards _closed and _pending with the puts: nothing is queued after the stop message.
        self._admission = threading.Lock()
        self._pending = 0  # reports submitted and not yet settled
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._writer_connection = self._connect()
        try:
            self._check_integrity(self._writer_connection)
            self._migrate(self._writer_connection)
            self._ranks_lock = threading.Lock()
            self._ranks: dict[RankKey, ReportedRank] = {}
            self._by_cluster: dict[str, dict[RankKey, ReportedRank]] = {}
            self._generations: dict[str, int] = {}
            ranks, self._checkpoint_id = self._load_ranks(self._writer_connection)
            self._publish(ranks)
            self._folded_before_s = self._load_folded_before(self._writer_connection)
        except BaseException:
            self._writer_connection.close()
            raise
        self._unreadable_folded: set[tuple[str, str]] = set()
        self._dirty: set[RankKey] = set()
        self._last_report_id = self._checkpoint_id
        self._writer = threading.Thread(target=self._run_writer, name="capwatch-store-writer", daemon=True)
        self._writer.start()

    # --- opening: integrity, schema, state --------------------------------------------------

    def _check_integrity(self, connection: sqlite3.Connection) -> None:
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

    def _migrate(self, connection: sqlite3.Connection) -> None:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreDamaged(f"it has schema version {version}, written by a newer capwatch (this one reads up "
                               f"to {SCHEMA_VERSION})")
        for target, script in enumerate(MIGRATIONS[version:], start=version + 1):
            connection.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {target};\nCOMMIT;")
            log.info("database %s migrated to schema version %d", self.path, target)

    def _load_ranks(self, connection: sqlite3.Connection) -> tuple[dict[RankKey, ReportedRank], int]:
        """The checkpointed rank states, brought up to date by replaying the reports after it. A state row
        the code cannot read is reported (logged) and rebuilt from the retained reports."""
        ranks: dict[RankKey, ReportedRank] = {}
        unreadable = 0
        for cluster, role, ep_rank, text in connection.execute("SELECT cluster, role, ep_rank, state FROM ranks"):
            try:
                ranks[(cluster, role, ep_rank)] = ReportedRank.from_dict(json.loads(text))
            except (ValueError, TypeError) as error:  # bad JSON, or a state the model refuses
                unreadable += 1
                log.warning("database %s: the state of rank %s/%s/%s cannot be read (%s); rebuilding the ranks from "
                            "the reports kept", self.path, cluster, role, ep_rank, str(error).splitlines()[0])
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
                log.warning("database %s: report row %d cannot be read (%s); skipped", self.path, report_id,
                            str(error).splitlines()[0])
                continue
            key = (report.identity.cluster, report.identity.role, report.identity.ep_rank)
            ranks[key] = apply_report(ranks.get(key), report, received)
        if last != checkpoint or unreadable:
            if unreadable:
                connection.execute("DELETE FROM ranks")
            self._write_checkpoint(connection, ranks, ranks.keys(), last)
        return ranks, last

    def _load_folded_before(self, connection: sqlite3.Connection) -> float:
        row = connection.execute("SELECT folded_before_s FROM fold_progress WHERE id = 0").fetchone()
        if row is not None:
            return row[0]
        if connection.execute("SELECT 1 FROM folded LIMIT 1").fetchone() is None:
            return float("-inf")  # nothing folded yet
        return self.clock() - self.options.fold_after_s  # folded before this table existed: assume current

    @staticmethod
    def _write_checkpoint(connection: sqlite3.Connection, ranks: dict, keys, last_report_id: int) -> None:
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(
            "INSERT OR REPLACE INTO ranks (cluster, role, ep_rank, state, received_unix_s) VALUES (?, ?, ?, ?, ?)",
            [(key[0], key[1], key[2], json.dumps(ranks[key].to_dict()), ranks[key].received_unix_s) for key in keys])
        connection.execute("INSERT OR REPLACE INTO checkpoint (id, last_report_id) VALUES (0, ?)", (last_report_id,))
        connection.execute("COMMIT")

    def _checkpoint(self, connection: sqlite3.Connection) -> None:
        if self._dirty:
            with self._ranks_lock:
                ranks = {key: self._ranks[key] for key in self._dirty if key in self._ranks}
            self._write_checkpoint(connection, ranks, ranks.keys(), self._last_report_id)
            self._dirty.clear()

    def _publish(self, ranks: dict[RankKey, ReportedRank]) -> None:
        """Make committed states visible to readers, and mark their clusters changed."""
        with self._ranks_lock:
            for key, state in ranks.items():
                self._ranks[key] = state
                self._by_cluster.setdefault(key[0], {})[key] = state
            for cluster in {key[0] for key in ranks}:
                self._generations[cluster] = self._generations.get(cluster, 0) + 1

    def _forget(self, keys: list[RankKey]) -> None:
        with self._ranks_lock:
            for key in keys:
                self._ranks.pop(key, None)
                members = self._by_cluster.get(key[0])
                if members is not None:
                    members.pop(key, None)
                    if not members:
                        del self._by_cluster[key[0]]
                self._generations[key[0]] = self._generations.get(key[0], 0) + 1

    # --- connections ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")  # durable at COMMIT, not just crash-consistent
            connection.execute("PRAGMA busy_timeout=30000")
        except sqlite3.DatabaseError as error:
            connection.close()
            raise StoreDamaged(f"SQLite cannot read it ({error})") from None
        return connection

    def _reader(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            connection.execute("PRAGMA query_only=ON")
            self._local.connection = connection
            with self._readers_lock:
                self._readers.append(connection)
        return connection

    # --- writes -------------------------------------------------------------------------------

    def submit(self, report: RankReport, received_unix_s: float | None = None,
               payload: bytes | None = None) -> concurrent.futures.Future:
        """Queue a validated report; the future resolves to IngestResult after COMMIT.
        ``payload``: the report's JSON as received (stored as is; saves re-serialising it)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        received = self.clock() if received_unix_s is None else received_unix_s
        with self._admission:
            refusal = self._admit()
            if refusal is None:
                self._queue.put(ReportBatch([PendingReport(report, received, payload, future)]))
        if refusal is not None:
            future.set_exception(refusal)
        return future

    def _admit(self) -> StoreUnavailable | None:
        """Count one more pending report, or say why not (the caller holds ``_admission``)."""
        if self._closed:
            return StoreUnavailable("the store is closed")
        if self._pending >= self.options.max_pending_reports:
            return StoreUnavailable(f"the store has {self._pending} reports waiting to be written "
                                    f"(its bound, max_pending_reports); the service is overloaded")
        self._pending += 1
        return None

    def _settled(self, reports: int) -> None:
        with self._admission:
            self._pending -= reports

    @property
    def pending_reports(self) -> int:
        """Reports submitted and not yet committed or refused (never above max_pending_reports)."""
        return self._pending

    def submit_async(self, report: RankReport, received_unix_s: float | None = None,
                     payload: bytes | None = None) -> asyncio.Future:
        """``submit`` for the event loop: an asyncio future, settled with ONE loop wake-up per
        committed batch (a cross-thread future per report cost more than the commit itself).
        The reports of one loop iteration reach the writer together, also in one wake-up: each
        wake-up is a GIL hand-over between the HTTP loop and the writer, the ingest path's main cost."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._admission:
            refusal = self._admit()
        if refusal is not None:
            future.set_exception(refusal)
            return future
        received = self.clock() if received_unix_s is None else received_unix_s
        gathered = self._gathering.get(loop)
        if gathered is None:
            gathered = self._gathering[loop] = []
            loop.call_soon(self._hand_over, loop)
        gathered.append(PendingReport(report, received, payload, _LoopWaiter(loop, future)))
        return future

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        gathered = self._gathering.pop(loop)
        with self._admission:
            closed = self._closed
            if not closed:
                self._queue.put(ReportBatch(gathered))
        if closed:  # closed while gathering: the writer is gone, nothing was stored
            self._refuse(gathered)

    def _refuse(self, batch: list[PendingReport]) -> None:
        self._settled(len(batch))
        _resolve(batch, None, StoreUnavailable("the store is closed"))

    def ingest(self, report: RankReport, received_unix_s: float | None = None) -> IngestResult:
        return self.submit(report, received_unix_s).result()

    def run_in_writer(self, function: Callable[[sqlite3.Connection], object]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._admission:
            if not self._closed:
                self._queue.put(WriterCall(function, future))
                return future
        future.set_exception(StoreUnavailable("the store is closed"))
        return future

    def maintain(self) -> None:
        """Fold old windows, apply retention and prune long-missing ranks now (the writer also does it
        every few seconds)."""
        self.run_in_writer(self._maintain).result()

    def _run_writer(self) -> None:
        connection = self._writer_connection
        next_maintenance = self.clock() + self.options.maintenance_interval_s
        next_checkpoint = time.monotonic() + self.options.checkpoint_interval_s
        stopping = False
        carried: list[PendingReport] = []  # reports that did not fit in the previous batch
        while not stopping:
            message: WriterMessage | None
            if carried:
                message, carried = ReportBatch(carried), []
            else:
                try:
                    message = self._queue.get(timeout=min(self.options.maintenance_interval_s,
                                                          self.options.checkpoint_interval_s))
                except queue.Empty:
                    message = None
            batch: list[PendingReport] = []
            calls: list[WriterCall] = []
            room = self.options.max_batch_reports
            while message is not None:
                match message:
                    case StopWriter():
                        stopping = True
                    case ReportBatch(reports=reports):
                        room = self.options.max_batch_reports - len(batch)
                        batch.extend(reports[:room])
                        carried = reports[room:]
                    case WriterCall():
                        calls.append(message)
                if stopping or carried or len(batch) >= self.options.max_batch_reports:
                    break
                try:
                    message = self._queue.get_nowait()
                except queue.Empty:
                    message = None
            if batch:
                self._commit(connection, batch)
            for call in calls:
                try:
                    call.future.set_result(call.function(connection))
                except Exception as error:  # surfaced to the caller, the writer keeps going
                    call.future.set_exception(error)
            if stopping or time.monotonic() >= next_checkpoint:
                try:
                    self._checkpoint(connection)
                except Exception:
                    log.exception("rank state checkpoint failed; the reports replay on start")
                next_checkpoint = time.monotonic() + self.options.checkpoint_interval_s
            if self.clock() >= next_maintenance:
                try:
                    self._maintain(connection)
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
                message = self._queue.get_nowait()
            except queue.Empty:
                break
            match message:
                case ReportBatch(reports=reports):
                    leftovers.extend(reports)
                case WriterCall(future=future):
                    future.set_exception(StoreUnavailable("the store is closed"))
        if leftovers:
            self._refuse(leftovers)

    def _commit(self, connection: sqlite3.Connection, batch: list[PendingReport]) -> None:
        """Commit the batch; if that fails for a reason other than the disk, find the reports that cannot
        be stored by committing halves, so a bad row never fails the other reports of its batch."""
        error = self._commit_once(connection, batch)
        if error is None:
            return
        if isinstance(error, sqlite3.OperationalError) or len(batch) == 1:
            # The disk (full, read-only, locked): no subset would do better. Or this one report is the cause.
            log.error("commit of %d report(s) failed: %s", len(batch), error)
            refusal = (StoreUnavailable(f"the report was not stored: {error}")
                       if isinstance(error, sqlite3.OperationalError)
                       else ReportNotStorable(f"the store cannot keep this report: {error}"))
            self._settled(len(batch))
            _resolve(batch, None, refusal)
            return
        middle = len(batch) // 2
        self._commit(connection, batch[:middle])
        self._commit(connection, batch[middle:])

    def _commit_once(self, connection: sqlite3.Connection, batch: list[PendingReport]) -> Exception | None:
        """One transaction for the batch, in a few many-row statements (see schema.py for why):
        find which reports are already stored, insert the new ones, grow their windows, COMMIT.
        Settles the batch and returns None, or rolls back and returns the error, settling nothing."""
        touched: dict[RankKey, ReportedRank] = {}
        last_report_id = self._last_report_id
        try:
            rows = [_report_row(pending.report, pending.received_unix_s, pending.payload) for pending in batch]
            connection.execute("BEGIN IMMEDIATE")
            seen = _stored_keys(connection, [row[:_KEY_LENGTH] for row in rows])
            results, new_rows, window_rows = [], [], []
            for row, pending in zip(rows, batch):
                key = row[:_KEY_LENGTH]
                if key in seen:  # stored before, or earlier in this batch
                    results.append(_DUPLICATE)
                    continue
                seen.add(key)
                results.append(_ACCEPTED)
                new_rows.append(row)
                report = pending.report
                interval = RankInterval(key[2], report.interval.end_unix_s, report.interval.peak_runtime_tokens,
                                        report.config.cap, row[_OVERFLOW_EVENTS], report.interval.forward_steps)
                window = window_start(interval.end_unix_s, self.options.window_s)
                # An idle interval adds nothing (the window rule). A window already folded into the
                # histogram has had its one sample: a row for it would be folded again as a second
                # sample, so a late report for it is kept raw (audit, dedupe) but adds no sample.
                if ran_steps(interval.forward_steps) and window >= self._folded_before_s:
                    window_rows.append((key[0], key[1], window, *window_values(interval), 1))  # 1: one more report
                rank = key[:3]
                state = touched.get(rank) or self._copy_state(rank)
                touched[rank] = apply_report(state, report, pending.received_unix_s)
            for chunk in _chunks(new_rows):
                last_report_id = connection.execute(insert_reports_sql(len(chunk)), _flat(chunk)).lastrowid
            for chunk in _chunks(window_rows):
                connection.execute(upsert_windows_sql(len(chunk)), _flat(chunk))
            connection.execute("COMMIT")
        except Exception as error:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            return error
        self._publish(touched)
        self._dirty.update(touched)
        self._last_report_id = last_report_id
        self._settled(len(batch))  # before the waiters wake: an acknowledged report is no longer pending
        _resolve(batch, results, None)
        return None

    def _copy_state(self, key: RankKey) -> ReportedRank | None:
        # A copy: the cached state changes only after COMMIT (a failed batch leaves it as it was).
        state = self._ranks.get(key)
        return None if state is None else state.copy()

    def _maintain(self, connection: sqlite3.Connection) -> None:
        now = self.clock()
        policy = self.options.policy
        fold_before = now - self.options.fold_after_s
        retained_after = now - self.options.retention_s
        connection.execute("BEGIN IMMEDIATE")
        try:
            keys = connection.execute(
                "SELECT DISTINCT cluster, role FROM windows WHERE window_start_s < ?", (fold_before,)).fetchall()
            for cluster, role in keys:
                history = self._folded(connection, cluster, role)
                rows = connection.execute(
                    _WINDOW_SELECT + "WHERE cluster = ? AND role = ? AND window_start_s < ? ORDER BY window_start_s",
                    (cluster, role, fold_before)).fetchall()
                history.add_all((sample_of(row[0], row[1:]) for row in rows), policy.bump_factor, policy.bump_min_tokens)
                history.forget_below(policy.forget_relative_weight, now)
                connection.execute("INSERT OR REPLACE INTO folded (cluster, role, history) VALUES (?, ?, ?)",
                                   (cluster, role, json.dumps(history.to_dict())))
                connection.execute("DELETE FROM windows WHERE cluster = ? AND role = ? AND window_start_s < ?",
                                   (cluster, role, fold_before))
            # Ids grow with arrival, so the rows past retention are a prefix of the id order: find its
            # end by walking from the start (cost ~ rows deleted) instead of indexing received time.
            connection.execute(
                "DELETE FROM reports WHERE id < coalesce((SELECT id FROM reports WHERE received_unix_s >= ? "
                "ORDER BY id LIMIT 1), (SELECT max(id) + 1 FROM reports))", (retained_after,))
            # A rank silent for longer than the retention has no report left: it is gone, not missing.
            with self._ranks_lock:
                gone = [key for key, state in self._ranks.items() if state.received_unix_s < retained_after]
            connection.execute("DELETE FROM ranks WHERE received_unix_s < ?", (retained_after,))
            folded_before = max(self._folded_before_s, fold_before)  # a clock stepping back folds no less
            connection.execute("INSERT OR REPLACE INTO fold_progress (id, folded_before_s) VALUES (0, ?)",
                               (folded_before,))
            connection.execute("COMMIT")
        except Exception:
            connection.execute("ROLLBACK")
            raise
        self._folded_before_s = folded_before
        if gone:
            self._forget(gone)
            self._dirty.difference_update(gone)
            log.info("pruned %d rank(s) silent for longer than the retention (%.0f s)", len(gone),
                     self.options.retention_s)
        with self._ranks_lock:  # a fold changes the clusters' history
            for cluster, _ in keys:
                self._generations[cluster] = self._generations.get(cluster, 0) + 1

    def _folded(self, connection: sqlite3.Connection, cluster: str, role: str) -> SampleHistory:
        row = connection.execute("SELECT history FROM folded WHERE cluster = ? AND role = ?",
                                 (cluster, role)).fetchone()
        empty = SampleHistory(self.options.policy.half_life_s, window_s=self.options.window_s)
        if row is None:
            return empty
        try:
            return SampleHistory.from_dict(json.loads(row[0]))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            if (cluster, role) not in self._unreadable_folded:  # reported once, not per request
                self._unreadable_folded.add((cluster, role))
                log.warning("database %s: the folded history of %s/%s cannot be read (%s); the advice uses the "
                            "recent windows only until the next fold rewrites it", self.path, cluster, role, error)
            return empty

    # --- reads ----------------------------------------------------------------------------------

    def clusters(self) -> list[str]:
        with self._ranks_lock:
            return sorted(self._by_cluster)

    def generation(self, cluster: str) -> int:
        """Changes whenever the cluster's committed data does (reports, folds, pruning): what a reader
        may cache the cluster's derived views under."""
        return self._generations.get(cluster, 0)

    def rank_states(self, cluster: str) -> list[ReportedRank]:
        """Committed states (published only after COMMIT; never mutated once published)."""
        with self._ranks_lock:
            states = list(self._by_cluster.get(cluster, {}).values())
        return sorted(states, key=lambda state: (state.role != "target", state.role, state.ep_rank))

    def sample_history(self, cluster: str, role: str) -> SampleHistory:
        connection = self._reader()
        policy = self.options.policy
        connection.execute("BEGIN")  # one snapshot: a fold between the two reads cannot double-count
        try:
            history = self._folded(connection, cluster, role)
            rows = connection.execute(
                _WINDOW_SELECT + "WHERE cluster = ? AND role = ? ORDER BY window_start_s", (cluster, role)).fetchall()
        finally:
            connection.execute("COMMIT")
        return history.add_all((sample_of(row[0], row[1:]) for row in rows), policy.bump_factor,
                               policy.bump_min_tokens)

    def interval_rows(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                      limit: int) -> list[IntervalRow]:
        rows = self._reader().execute(
            "SELECT ep_rank, interval_end_unix_s, peak_runtime_tokens, cap, forward_steps, overflow_events, "
            "max_local_tokens FROM reports WHERE cluster = ? AND role = ? AND interval_end_unix_s >= ? "
            "AND interval_end_unix_s <= ? ORDER BY interval_end_unix_s DESC LIMIT ?",
            (cluster, role, since_unix_s, until_unix_s, limit)).fetchall()
        return [IntervalRow(*row) for row in reversed(rows)]

    def report_count(self) -> int:
        return self._reader().execute("SELECT count(*) FROM reports").fetchone()[0]

    def report_keys(self) -> set[tuple[str, str, int, str, int]]:
        return set(self._reader().execute("SELECT cluster, role, ep_rank, boot_id, sequence FROM reports"))

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._admission:
            if self._closed:
                return
            self._closed = True
            self._queue.put(StopWriter())
        self._writer.join(timeout=30)
        with self._readers_lock:
            for connection in self._readers:
                try:
                    connection.close()
                except sqlite3.ProgrammingError:  # owned by another thread; closes with it
                    pass
            self._readers.clear()
