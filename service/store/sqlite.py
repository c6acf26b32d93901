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
from capwatch.service.advisor.sample import GroupSample, window_start
from capwatch.service.store.rank_state import RankState, apply_report
from capwatch.service.store.schema import (REPORT_COLUMNS, REPORT_KEY_COLUMNS, SCHEMA, existing_reports_sql,
                                   insert_reports_sql, upsert_windows_sql)
from capwatch.telemetry.report import RankReport

log = logging.getLogger(__name__)
_STOP = object()


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
class IntervalRow:
    ep_rank: int
    interval_end_unix_s: float
    peak_runtime_tokens: int
    cap: int
    forward_steps: int
    overflow_events: int


@dataclass(frozen=True)
class _LoopWaiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def _settle(outcomes: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue  # the client went away; the report is stored all the same
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _resolve(batch: list, results: list | None, error: BaseException | None) -> None:
    """Settle every waiter of a batch: concurrent futures directly, asyncio futures per loop in one call."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for index, (_, _, waiter) in enumerate(batch):
        result = results[index] if results is not None else None
        if isinstance(waiter, _LoopWaiter):
            by_loop.setdefault(waiter.loop, []).append((waiter.future, result, error))
        elif error is not None:
            waiter.set_exception(error)
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


def _runtime_overflows(report: RankReport) -> int:
    return sum(event.count for event in report.interval.overflow_events if event.kind == "runtime_over_cap")


_ACCEPTED = IngestResult(accepted=True, duplicate=False)
_DUPLICATE = IngestResult(accepted=True, duplicate=True)
_KEY_LENGTH = len(REPORT_KEY_COLUMNS)
_OVERFLOW_EVENTS = REPORT_COLUMNS.index("overflow_events")
_ROWS_PER_STATEMENT = 512  # 512 x 12 parameters stays well under SQLite's limit of 32,766


def _report_row(report: RankReport, received: float, payload: bytes | None) -> tuple:
    """The report's ``reports`` row, in REPORT_COLUMNS order (its key first)."""
    identity, interval = report.identity, report.interval
    return (identity.cluster, identity.role, identity.ep_rank, identity.boot_id, report.sequence, received,
            interval.end_unix_s, interval.peak_runtime_tokens, report.config.cap, interval.forward_steps,
            _runtime_overflows(report), payload.decode() if payload is not None else report.model_dump_json())


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
        self._gathering: dict[asyncio.AbstractEventLoop, list] = {}  # per loop, touched only by that loop
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # C: put costs the HTTP loop far less
        # Guards _closed and _pending with the puts: nothing is queued after the stop sentinel.
        self._admission = threading.Lock()
        self._pending = 0  # reports submitted and not yet settled
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._writer_connection = self._connect()
        self._writer_connection.executescript(SCHEMA)
        self._ranks_lock = threading.Lock()
        self._ranks, self._checkpoint_id = self._load_ranks(self._writer_connection)
        self._folded_before_s = self._load_folded_before(self._writer_connection)
        self._dirty: set[tuple[str, str, int]] = set()
        self._last_report_id = self._checkpoint_id
        self._writer = threading.Thread(target=self._run_writer, name="capwatch-store-writer", daemon=True)
        self._writer.start()

    def _load_ranks(self, connection: sqlite3.Connection) -> tuple[dict, int]:
        """The checkpointed rank states, brought up to date by replaying the reports after it."""
        ranks = {(row[0], row[1], row[2]): RankState.from_dict(json.loads(row[3]))
                 for row in connection.execute("SELECT cluster, role, ep_rank, state FROM ranks")}
        row = connection.execute("SELECT last_report_id FROM checkpoint WHERE id = 0").fetchone()
        checkpoint = row[0] if row else 0
        last = checkpoint
        for report_id, payload, received in connection.execute(
                "SELECT id, payload, received_unix_s FROM reports WHERE id > ? ORDER BY id", (checkpoint,)):
            report = RankReport.model_validate_json(payload)
            key = (report.identity.cluster, report.identity.role, report.identity.ep_rank)
            ranks[key] = apply_report(ranks.get(key), report, received)
            last = report_id
        if last != checkpoint:
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
            "INSERT OR REPLACE INTO ranks (cluster, role, ep_rank, state) VALUES (?, ?, ?, ?)",
            [(key[0], key[1], key[2], json.dumps(ranks[key].to_dict())) for key in keys])
        connection.execute("INSERT OR REPLACE INTO checkpoint (id, last_report_id) VALUES (0, ?)", (last_report_id,))
        connection.execute("COMMIT")

    def _checkpoint(self, connection: sqlite3.Connection) -> None:
        if self._dirty:
            with self._ranks_lock:
                ranks = {key: self._ranks[key] for key in self._dirty}
            self._write_checkpoint(connection, ranks, ranks.keys(), self._last_report_id)
            self._dirty.clear()

    # --- connections ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")  # durable at COMMIT, not just crash-consistent
        connection.execute("PRAGMA busy_timeout=30000")
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
                self._queue.put((report, (received, payload), future))
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
        gathered.append((report, (received, payload), _LoopWaiter(loop, future)))
        return future

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        gathered = self._gathering.pop(loop)
        with self._admission:
            closed = self._closed
            if not closed:
                self._queue.put(gathered)
        if closed:  # closed while gathering: the writer is gone, nothing was stored
            self._refuse(gathered)

    def _refuse(self, batch: list) -> None:
        _resolve(batch, None, StoreUnavailable("the store is closed"))
        self._settled(len(batch))

    def ingest(self, report: RankReport, received_unix_s: float | None = None) -> IngestResult:
        return self.submit(report, received_unix_s).result()

    def run_in_writer(self, function: Callable[[sqlite3.Connection], object]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._admission:
            if not self._closed:
                self._queue.put((function, None, future))
                return future
        future.set_exception(StoreUnavailable("the store is closed"))
        return future

    def maintain(self) -> None:
        """Fold old windows and apply retention now (the writer also does it every few seconds)."""
        self.run_in_writer(self._maintain).result()

    def _run_writer(self) -> None:
        connection = self._writer_connection
        next_maintenance = self.clock() + self.options.maintenance_interval_s
        next_checkpoint = time.monotonic() + self.options.checkpoint_interval_s
        stopping = False
        carried = None  # reports that did not fit in the previous batch
        while not stopping:
            if carried is not None:
                first, carried = carried, None
            else:
                try:
                    first = self._queue.get(timeout=min(self.options.maintenance_interval_s,
                                                        self.options.checkpoint_interval_s))
                except queue.Empty:
                    first = None
            batch, calls = [], []
            item = first
            while item is not None:
                if item is _STOP:
                    stopping = True
                    break
                if isinstance(item, list):  # one loop iteration's reports (submit_async)
                    room = self.options.max_batch_reports - len(batch)
                    if len(item) > room:
                        batch.extend(item[:room])
                        carried = item[room:]
                        break
                    batch.extend(item)
                else:
                    (batch if isinstance(item[0], RankReport) else calls).append(item)
                if len(batch) >= self.options.max_batch_reports:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if batch:
                self._commit(connection, batch)
            for function, _, future in calls:
                try:
                    future.set_result(function(connection))
                except Exception as error:  # surfaced to the caller, the writer keeps going
                    future.set_exception(error)
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

    def _fail_leftovers(self, carried: list | None) -> None:
        """After the stop sentinel: refuse whatever is still queued, so no request waits forever.
        (Admission puts nothing after the sentinel; this also covers a batch cut off by it.)"""
        leftovers = list(carried or [])
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, list):
                leftovers.extend(item)
            elif item is not _STOP:
                if isinstance(item[0], RankReport):
                    leftovers.append(item)
                else:
                    item[2].set_exception(StoreUnavailable("the store is closed"))
        if leftovers:
            self._refuse(leftovers)

    def _commit(self, connection: sqlite3.Connection, batch: list) -> None:
        """One transaction for the batch, in a few many-row statements (see schema.py for why):
        find which reports are already stored, insert the new ones, grow their windows, COMMIT."""
        rows = [_report_row(report, received, payload) for report, (received, payload), _ in batch]
        touched: dict[tuple[str, str, int], RankState] = {}
        last_report_id = self._last_report_id
        try:
            connection.execute("BEGIN IMMEDIATE")
            seen = _stored_keys(connection, [row[:_KEY_LENGTH] for row in rows])
            results, new_rows, window_rows = [], [], []
            for row, (report, (received, _), _) in zip(rows, batch):
                key = row[:_KEY_LENGTH]
                if key in seen:  # stored before, or earlier in this batch
                    results.append(_DUPLICATE)
                    continue
                seen.add(key)
                results.append(_ACCEPTED)
                new_rows.append(row)
                interval = report.interval
                window = window_start(interval.end_unix_s, self.options.window_s)
                # An idle interval says nothing about the need. A window already folded into the
                # histogram has had its one sample: a row for it would be folded again as a second
                # sample, so a late report for it is kept raw (audit, dedupe) but adds no sample.
                if interval.forward_steps > 0 and window >= self._folded_before_s:
                    window_rows.append((key[0], key[1], window, interval.peak_runtime_tokens, report.config.cap,
                                        row[_OVERFLOW_EVENTS], 1))  # 1: one more report in the window
                rank = key[:3]
                state = touched.get(rank) or self._copy_state(rank)
                touched[rank] = apply_report(state, report, received)
            for chunk in _chunks(new_rows):
                last_report_id = connection.execute(insert_reports_sql(len(chunk)), _flat(chunk)).lastrowid
            for chunk in _chunks(window_rows):
                connection.execute(upsert_windows_sql(len(chunk)), _flat(chunk))
            connection.execute("COMMIT")
        except Exception as error:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            log.exception("commit of %d reports failed", len(batch))
            _resolve(batch, None, StoreUnavailable(f"the report was not stored: {error}"))
            self._settled(len(batch))
            return
        with self._ranks_lock:
            self._ranks.update(touched)
        self._dirty.update(touched)
        self._last_report_id = last_report_id
        _resolve(batch, results, None)
        self._settled(len(batch))

    def _copy_state(self, key: tuple[str, str, int]) -> RankState | None:
        # A copy: the cached state changes only after COMMIT (a failed batch leaves it as it was).
        state = self._ranks.get(key)
        return None if state is None else state.copy()

    def _maintain(self, connection: sqlite3.Connection) -> None:
        now = self.clock()
        policy = self.options.policy
        fold_before = now - self.options.fold_after_s
        connection.execute("BEGIN IMMEDIATE")
        try:
            keys = connection.execute(
                "SELECT DISTINCT cluster, role FROM windows WHERE window_start_s < ?", (fold_before,)).fetchall()
            for cluster, role in keys:
                history = self._folded(connection, cluster, role)
                rows = connection.execute(
                    "SELECT window_start_s, peak_runtime_tokens, cap, overflow_events FROM windows "
                    "WHERE cluster = ? AND role = ? AND window_start_s < ? ORDER BY window_start_s",
                    (cluster, role, fold_before)).fetchall()
                history.add_all((GroupSample(*row) for row in rows), policy.bump_factor, policy.bump_min_tokens)
                history.forget_below(policy.forget_relative_weight, now)
                connection.execute("INSERT OR REPLACE INTO folded (cluster, role, history) VALUES (?, ?, ?)",
                                   (cluster, role, json.dumps(history.to_dict())))
                connection.execute("DELETE FROM windows WHERE cluster = ? AND role = ? AND window_start_s < ?",
                                   (cluster, role, fold_before))
            # Ids grow with arrival, so the rows past retention are a prefix of the id order: find its
            # end by walking from the start (cost ~ rows deleted) instead of indexing received time.
            connection.execute(
                "DELETE FROM reports WHERE id < coalesce((SELECT id FROM reports WHERE received_unix_s >= ? "
                "ORDER BY id LIMIT 1), (SELECT max(id) + 1 FROM reports))", (now - self.options.retention_s,))
            folded_before = max(self._folded_before_s, fold_before)  # a clock stepping back folds no less
            connection.execute("INSERT OR REPLACE INTO fold_progress (id, folded_before_s) VALUES (0, ?)",
                               (folded_before,))
            connection.execute("COMMIT")
        except Exception:
            connection.execute("ROLLBACK")
            raise
        self._folded_before_s = folded_before

    def _folded(self, connection: sqlite3.Connection, cluster: str, role: str) -> SampleHistory:
        row = connection.execute("SELECT history FROM folded WHERE cluster = ? AND role = ?",
                                 (cluster, role)).fetchone()
        if row is None:
            return SampleHistory(self.options.policy.half_life_s, window_s=self.options.window_s)
        return SampleHistory.from_dict(json.loads(row[0]))

    # --- reads ----------------------------------------------------------------------------------

    def clusters(self) -> list[str]:
        with self._ranks_lock:
            return sorted({key[0] for key in self._ranks})

    def rank_states(self, cluster: str) -> list[RankState]:
        """Committed states (published only after COMMIT; never mutated once published)."""
        with self._ranks_lock:
            states = [state for key, state in self._ranks.items() if key[0] == cluster]
        return sorted(states, key=lambda state: (state.role != "target", state.role, state.ep_rank))

    def sample_history(self, cluster: str, role: str) -> SampleHistory:
        connection = self._reader()
        policy = self.options.policy
        connection.execute("BEGIN")  # one snapshot: a fold between the two reads cannot double-count
        try:
            history = self._folded(connection, cluster, role)
            rows = connection.execute(
                "SELECT window_start_s, peak_runtime_tokens, cap, overflow_events FROM windows "
                "WHERE cluster = ? AND role = ? ORDER BY window_start_s", (cluster, role)).fetchall()
        finally:
            connection.execute("COMMIT")
        return history.add_all((GroupSample(*row) for row in rows), policy.bump_factor, policy.bump_min_tokens)

    def interval_rows(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                      limit: int) -> list[IntervalRow]:
        rows = self._reader().execute(
            "SELECT ep_rank, interval_end_unix_s, peak_runtime_tokens, cap, forward_steps, overflow_events "
            "FROM reports WHERE cluster = ? AND role = ? AND interval_end_unix_s >= ? AND interval_end_unix_s <= ? "
            "ORDER BY interval_end_unix_s DESC LIMIT ?", (cluster, role, since_unix_s, until_unix_s, limit)).fetchall()
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
            self._queue.put(_STOP)
        self._writer.join(timeout=30)
        with self._readers_lock:
            for connection in self._readers:
                try:
                    connection.close()
                except sqlite3.ProgrammingError:  # owned by another thread; closes with it
                    pass
            self._readers.clear()
