"""Posts one rank's interval reports to the service, from a background thread.

The dispatch never calls into the reporter (it only bumps its device counters); the reporter
thread snapshots them every ``interval_s``. So a slow, dead or hanging service cannot slow a step.
With ``interval_s=None`` the caller cuts each interval itself (``cut_interval``: a replay cuts by its
own clock, not the wall's) and the thread only sends.
What it costs instead is bounded: at most ``max_pending_reports`` reports wait in memory; when
more pile up, the oldest unsent ones are merged (histograms add, peaks take the max), so no
step is ever lost, only time resolution. Each report keeps its ``(boot_id, sequence)`` across
retries, so the service can drop a duplicate; sequences are assigned when a report is first
sent, so the service sees 0, 1, 2, ... without gaps.

The one blocking call is ``flush_final``: the dispatcher's raise path calls it just before the
rank dies, and it waits at most ``timeout_s`` for the final report to be accepted. After it, an
interval with nothing new is not sent (it would supersede the final report at the service, which
would take a dying rank for a live one); if the rank survives after all (someone caught the error)
and works on, reporting goes on and its next report supersedes the final one.
"""

from __future__ import annotations

import enum
import http.client
import json
import logging
import math
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from capwatch.dispatcher.counters import DispatchCounters
from capwatch.telemetry.endpoint import bearer_token_problem, http_url_problem
from capwatch.telemetry.intervals import IntervalTracker, cumulative_counters, merge_intervals
from capwatch.telemetry.report import CumulativeCounters, Interval, RankConfig, RankIdentity, RankReport

log = logging.getLogger(__name__)

REPORTS_PATH = "/v1/reports"
MAX_FINAL_REASON_CHARS = 2000


def new_boot_id() -> str:
    """A fresh id per rank process start: the service resets its view of the counters on a new one."""
    return uuid.uuid4().hex


# Each duration's sane range: a report a second at most 100 times over, at least once a day; waits that end.
DURATION_RANGES = {"interval_s": (0.01, 86_400.0), "request_timeout_s": (0.01, 300.0),
                   "backoff_initial_s": (0.01, 60.0), "backoff_max_s": (0.01, 3600.0)}


@dataclass(frozen=True)
class ReporterOptions:
    service_url: str  # e.g. http://127.0.0.1:8000 ; reports go to {service_url}/v1/reports
    interval_s: float | None = 5.0  # None: the caller cuts every interval (RankReporter.cut_interval)
    bearer_token: str | None = None
    max_pending_reports: int = 64
    request_timeout_s: float = 2.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        problem = http_url_problem(self.service_url)
        if problem is not None:
            raise ValueError(f"service_url {self.service_url[:200]!r}: {problem}")
        if self.bearer_token is not None:
            problem = bearer_token_problem(self.bearer_token)
            if problem is not None:
                raise ValueError(f"the bearer token cannot be sent in an Authorization header: {problem}")
        for name, (low, high) in DURATION_RANGES.items():
            value = getattr(self, name)
            if name == "interval_s" and value is None:  # the caller cuts every interval
                continue
            if not low <= value <= high:  # also NaN: every comparison with it is False
                raise ValueError(f"{name} must be within {low:g}..{high:g} s, got {value}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        if self.max_pending_reports < 3:
            raise ValueError(f"max_pending_reports must be >= 3 (to merge behind the one in flight), "
                             f"got {self.max_pending_reports}")

    @property
    def reports_url(self) -> str:
        return self.service_url.rstrip("/") + REPORTS_PATH


@dataclass(frozen=True)
class ReporterStats:
    pending: int = 0  # reports buffered, the one in flight included
    delivered: int = 0
    send_failures: int = 0  # attempts that will be retried: unreachable, timeout, broken response, 5xx/408/429
    rejected: int = 0  # refused for good (4xx other than auth and throttling)
    auth_failures: int = 0  # attempts the service refused with 401/403: retried, but a token must be fixed
    # Buffered reports merged into the next one while the buffer was full: their counts arrive, but their
    # windows' peaks land in the merged interval's window (coarser history, not lost data).
    merged: int = 0
    # Errors of this rank's own counting or reporting code, caught: an interval that could not be cut, a report
    # that could not be built. Logged once per streak; the steps stay in the counters and go with the next cut.
    errors: int = 0


class Delivery(enum.Enum):
    DELIVERED = "delivered"  # 2xx, including "duplicate": the service has it
    RETRY = "retry"  # unreachable, timeout, broken response, 5xx, 408/425/429
    UNAUTHORIZED = "unauthorized"  # 401/403: retried (a token is fixable on either side), counted apart
    REJECTED = "rejected"  # any other 4xx: this report can never be accepted

    @property
    def retried(self) -> bool:
        return self in (Delivery.RETRY, Delivery.UNAUTHORIZED)


AUTH_STATUSES = (401, 403)


def classify_status(status: int) -> Delivery:
    if 200 <= status < 300:
        return Delivery.DELIVERED
    if status in AUTH_STATUSES:
        return Delivery.UNAUTHORIZED
    if status >= 500 or status in (408, 425, 429):
        return Delivery.RETRY
    return Delivery.REJECTED


@dataclass(frozen=True)
class SendResult:
    """What one POST came to, with what went wrong for the log (HTTP status or the exception)."""

    delivery: Delivery
    detail: str = ""


def _status_of(detail: str) -> str:
    """``"HTTP 503 ..."`` -> ``"503"``: failures with another status are another state (logged anew)."""
    return detail.split(" ", 2)[1] if detail.startswith("HTTP ") else ""


class HttpReportSender:
    """``POST {service_url}/v1/reports`` with the stdlib (ranks stay light); ignores proxy settings."""

    def __init__(self, options: ReporterOptions):
        self._url = options.reports_url
        self._timeout_s = options.request_timeout_s
        self._headers = {"Content-Type": "application/json"}
        if options.bearer_token:
            self._headers["Authorization"] = f"Bearer {options.bearer_token}"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __call__(self, report: RankReport) -> SendResult:
        body = json.dumps(report.model_dump(mode="json"), separators=(",", ":")).encode()
        request = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=self._timeout_s) as response:
                response.read()
                return SendResult(classify_status(response.status), f"HTTP {response.status}")
        except urllib.error.HTTPError as error:
            try:
                text = error.read(500).decode(errors="replace")
            except (OSError, http.client.HTTPException):
                text = ""
            return SendResult(classify_status(error.code), f"HTTP {error.code} {text}".rstrip())
        # Refused, reset, timeout, DNS (OSError, URLError), or a broken response: truncated body
        # (IncompleteRead), garbage status line (BadStatusLine), ... (HTTPException). All worth a retry.
        except (OSError, http.client.HTTPException) as error:
            return SendResult(Delivery.RETRY, f"{type(error).__name__}: {error}")


@dataclass
class _Outcome:
    done: threading.Event = field(default_factory=threading.Event)  # accepted or refused for good
    verdict: Delivery | None = None


@dataclass
class _Pending:
    interval: Interval
    counters: CumulativeCounters
    final_reason: str | None = None
    report: RankReport | None = None  # built, with its sequence, on the first attempt; reused on retries
    outcome: _Outcome = field(default_factory=_Outcome)  # shared with whatever it gets merged into

    @property
    def final(self) -> bool:
        return self.final_reason is not None


class RankReporter:
    def __init__(
        self,
        counters: DispatchCounters,
        identity: RankIdentity,
        config: RankConfig,
        options: ReporterOptions,
        *,
        sender: Callable[[RankReport], SendResult] | None = None,
        tracker: IntervalTracker | None = None,
    ):
        if (counters.cap, counters.ep_size, counters.role) != (config.cap, identity.ep_size, identity.role):
            raise ValueError(
                f"counters (cap {counters.cap}, ep_size {counters.ep_size}, role {counters.role}) do not match "
                f"the reported config (cap {config.cap}, ep_size {identity.ep_size}, role {identity.role})")
        self.identity = identity
        self.config = config
        self.options = options
        self.tracker = tracker if tracker is not None else IntervalTracker(counters)
        self._send = sender if sender is not None else HttpReportSender(options)
        self._pending: deque[_Pending] = deque()
        self._wake = threading.Condition()
        self._next_sequence = 0
        self._retry_at = 0.0
        self._backoff_s = options.backoff_initial_s
        self._stopping = False
        self._ticking = True
        # The totals the last final report carried; close() sends no second final while they still hold
        # (a rank dying of an overflow: the overflow's final, not a "shutdown" one, is its last word).
        self._last_final: _Pending | None = None
        self._thread: threading.Thread | None = None
        self._delivered = self._send_failures = self._rejected = self._auth_failures = self._merged = 0
        self._errors = 0
        self._error_streak = False  # a cut error was logged and no cut has succeeded since
        self._failing: str | None = None  # the failure state last logged (None: delivering); see _enter_state

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "RankReporter":
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"capwatch-reporter-{self.identity.ep_rank}", daemon=True)
            self._thread.start()
        return self

    def close(self, final_reason: str | None = None, timeout_s: float = 2.0) -> bool | None:
        """Stop cutting intervals; with ``final_reason``, send the last one as a final report; stop
        the thread. Within ``timeout_s`` in all; whatever is not accepted by then is dropped.
        Returns whether the final report was accepted (None without one). When nothing happened since
        an earlier final report (a rank exiting after its overflow's), that one stays the rank's last
        word: close waits for it instead of sending a second."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            self._ticking = False  # nothing may follow the final report
        last_final = self._last_final
        try:
            nothing_new = bool(final_reason) and self._nothing_since_final()
        except Exception as error:  # noqa: BLE001 (closing must not raise in the rank's thread either)
            with self._wake:
                self._count_error("closing", error)
            nothing_new = False
        if nothing_new:
            # Nothing happened since that final: it stays the last word; wait for it instead.
            last_final.outcome.done.wait(max(0.0, deadline - time.monotonic()))
            delivered = last_final.outcome.verdict is Delivery.DELIVERED
        else:
            delivered = self.flush_final(final_reason, timeout_s) if final_reason else None
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return delivered

    def flush_final(self, reason: str, timeout_s: float = 2.0) -> bool:
        """Close the interval now and send it as a final report, after any still pending;
        wait at most ``timeout_s``. True when the service accepted it. Never raises: it runs in the
        dispatch thread, on the way to the rank's own error, which must stay the one that surfaces."""
        try:
            return self._flush_final(reason, time.monotonic() + timeout_s)
        except Exception:  # noqa: BLE001 (a reporter bug must not replace the rank's error)
            self._failed_unexpectedly()
            return False

    def _flush_final(self, reason: str, deadline: float) -> bool:
        with self._wake:
            interval, snapshot = self.tracker.close()
            final = _Pending(interval, cumulative_counters(snapshot),
                             final_reason=reason[:MAX_FINAL_REASON_CHARS] or "final")
            self._last_final = final
            self._enqueue(final)
            self._retry_at = 0.0  # try now, whatever the backoff said
            self._wake.notify_all()
        if self._thread is None or not self._thread.is_alive():
            self._drain(deadline)  # no worker (never started, or stopped): send from here
        final.outcome.done.wait(max(0.0, deadline - time.monotonic()))
        return final.outcome.verdict is Delivery.DELIVERED

    def cut_interval(self) -> None:
        """Close the current interval now and queue its report, as the thread does every ``interval_s``
        (e.g. before a planned pause, or to drive the reporter step by step); nothing after a close.
        Never raises: it runs in the rank's own thread (a replay's), which telemetry must never end."""
        with self._wake:
            if self._ticking:
                self._cut_locked()
                self._wake.notify_all()

    def _cut_locked(self) -> None:
        """(Caller holds ``_wake``.) Cut and queue one interval; an error in it is counted and logged once per
        streak, never raised: the interval is not closed, so its steps go with the next cut."""
        try:
            if self._nothing_since_final():
                # A report after a final one supersedes it (the service takes the rank for alive again), so only
                # one with something new goes: a rank dying of its overflow must not send an empty tick after it.
                return
            interval, snapshot = self.tracker.close()
            self._enqueue(_Pending(interval, cumulative_counters(snapshot)))
            self._error_streak = False
        except Exception as error:  # noqa: BLE001 (a counting bug must not end the rank, nor stop its reporting)
            self._count_error("cutting an interval", error)

    def _count_error(self, doing: str, error: Exception) -> None:
        """(Caller holds ``_wake``.) One caught error of the reporter's own code: counted, one line per streak."""
        self._errors += 1
        if not self._error_streak:
            self._error_streak = True
            log.error("capwatch reporter: %s failed (%s: %s); the rank and its counting go on, the steps stay for the "
                      "next interval (counted in moe_a2a_reporter_errors_total; logged once until a cut succeeds)",
                      doing, type(error).__name__, str(error)[:500].replace("\n", " "))

    def _nothing_since_final(self) -> bool:
        """Whether a final report was queued and the counters still hold its totals."""
        last_final = self._last_final
        return last_final is not None and cumulative_counters(self.tracker.snapshot()) == last_final.counters

    def stats(self) -> ReporterStats:
        return ReporterStats(pending=len(self._pending), delivered=self._delivered,
                             send_failures=self._send_failures, rejected=self._rejected,
                             auth_failures=self._auth_failures, merged=self._merged, errors=self._errors)

    @property
    def next_sequence(self) -> int:
        return self._next_sequence

    # --- the worker thread ----------------------------------------------------------------------

    def _run(self) -> None:
        interval_s = self.options.interval_s
        next_tick = math.inf if interval_s is None else time.monotonic() + interval_s  # inf: the caller cuts
        while True:
            try:
                with self._wake:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    if now >= next_tick and self._ticking:
                        next_tick = max(next_tick + interval_s, now + interval_s / 2)
                        self._cut_locked()
                    if not (self._pending and now >= self._retry_at):
                        wake_at = min(next_tick, self._retry_at) if self._pending else next_tick
                        self._wake.wait(timeout=None if wake_at == math.inf else max(0.0, wake_at - now))
                        continue
                self._drain(deadline=None)
            except Exception:  # noqa: BLE001 (nothing may end the thread: reporting would stop for good, silently)
                self._failed_unexpectedly()

    def _failed_unexpectedly(self) -> None:
        """Count an unexpected error as a failed send and back off; the pending reports stay. Its traceback is
        logged when the reporter enters this state, not on every attempt in it."""
        with self._wake:
            self._send_failures += 1
            self._back_off()
            if self._enter_state("error"):
                log.exception("capwatch reporter error; reports stay buffered and are retried (logged once until a "
                              "report is delivered again)")

    def _back_off(self) -> None:
        """(Caller holds ``_wake``.) Next attempt after a jittered, doubling delay."""
        delay = self._backoff_s * random.uniform(0.5, 1.0)  # jitter: ranks don't retry in lockstep
        self._backoff_s = min(self._backoff_s * 2, self.options.backoff_max_s)
        self._retry_at = time.monotonic() + delay

    def _enqueue(self, pending: _Pending) -> None:
        """Append (the caller holds ``_wake``); past the bound, merge the two oldest unsent reports
        (never merging a final report into a later one: the service must see why a rank stopped)."""
        self._pending.append(pending)
        while len(self._pending) > self.options.max_pending_reports:
            index = next((i for i in range(len(self._pending) - 1)
                          if self._pending[i].report is None and not self._pending[i].final), None)
            if index is None:
                return
            earlier, later = self._pending[index], self._pending[index + 1]
            merged = _Pending(merge_intervals(earlier.interval, later.interval), later.counters, later.final_reason,
                              outcome=later.outcome)
            del self._pending[index]
            self._pending[index] = merged
            self._merged += 1

    def _drain(self, deadline: float | None) -> None:
        """Send pending reports in order until one fails (then back off) or none are left."""
        while deadline is None or time.monotonic() < deadline:
            with self._wake:
                if not self._pending:
                    return
                head = self._pending[0]
                if head.report is None:
                    head.report = self._build(head)
            result = self._send(head.report)
            verdict = result.delivery
            with self._wake:
                if verdict.retried:
                    if verdict is Delivery.UNAUTHORIZED:
                        self._auth_failures += 1
                    else:
                        self._send_failures += 1
                    self._back_off()
                    self._log_failure(verdict, result.detail)
                    return
                self._pending.popleft()
                if verdict is Delivery.DELIVERED:
                    self._delivered += 1
                    if self._enter_state(None):
                        log.info("capwatch service at %s accepts reports again", self.options.reports_url)
                else:
                    self._rejected += 1
                    if self._enter_state("rejected" + _status_of(result.detail)):
                        log.error("capwatch service at %s refused report %s/%d for good (%s); dropped (logged once "
                                  "until a report is delivered again)", self.options.reports_url,
                                  head.report.identity.boot_id, head.report.sequence, result.detail)
                head.outcome.verdict = verdict
                head.outcome.done.set()
                self._backoff_s = self.options.backoff_initial_s
                self._retry_at = 0.0

    def _enter_state(self, state: str | None) -> bool:
        """(Caller holds ``_wake``.) Move to ``state`` (None: delivering); True when it changed, i.e. when the
        caller logs: each failure is counted, and logged once per change of state, never once per send."""
        if state == self._failing:
            return False
        self._failing = state
        return True

    def _log_failure(self, verdict: Delivery, detail: str) -> None:
        """(Caller holds ``_wake``.) Once per kind of failure in a streak, saying what the service answered."""
        if not self._enter_state(verdict.value + _status_of(detail)):
            return
        if verdict is Delivery.UNAUTHORIZED:
            log.error("capwatch service at %s refuses this rank's bearer token (%s); retrying, reports buffered. "
                      "Set the rank's token to the service's", self.options.reports_url, detail)
        else:
            log.warning("capwatch service at %s did not take a report (%s); retrying, reports buffered",
                        self.options.reports_url, detail)

    def _build(self, pending: _Pending) -> RankReport:
        sequence = self._next_sequence
        self._next_sequence += 1
        return RankReport(
            identity=self.identity,
            sequence=sequence,
            sent_unix_s=time.time(),
            config=self.config,
            counters=pending.counters,
            interval=pending.interval,
            final=pending.final,
            final_reason=pending.final_reason,
        )
