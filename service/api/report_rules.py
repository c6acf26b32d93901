"""The rules a report must pass before it is stored, in the order they apply — the one place both
ways in read them: the ASGI fast path (``ReportFastPath``) and the router's ``post_report``.

1. the bearer token, when the service has one (401), and no foreign ``Origin`` (403: a browser
   names the page that sends a request; ranks send none);
2. ``Content-Type: application/json`` (415: a cross-origin page can post ``text/plain`` without
   a preflight, never ``application/json``);
3. the declared size (413), then the body itself: at most ``max_body_bytes`` (413), received within
   ``body_timeout_s`` (408), and at most ``max_concurrent_bodies`` waited for at once, at most
   ``max_bodies_per_client`` of them from one address (503; a body that follows its headers within
   ``body_grace_s`` takes no slot), so slow clients cannot hold the service or keep a rank's report out;
4. the schema, strictly, with its cross-field and pricing checks (``telemetry.report``; 422), a body over
   ``HEAVY_BODY_BYTES`` off the event loop (``HeavyBodies``);
5. the times, against the service's clock (422).

Each refusal is a ``Refusal``: its status, its reason (the ``capwatch_reports_rejected_total`` label)
and its body, made the same way for both ways in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import multiprocessing
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from capwatch.service.api.deps import bearer_token_accepted
from capwatch.service.config import Settings
from capwatch.telemetry.report import RankReport
from pydantic import BaseModel, ValidationError
from starlette.types import Message, Receive

log = logging.getLogger(__name__)


class FieldError(BaseModel):
    field: str
    message: str
    type: str


class RejectedReport(BaseModel):
    detail: str
    errors: list[FieldError] = []


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # capwatch_reports_rejected_total{reason=...}
    detail: str
    errors: list[FieldError] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        return RejectedReport(detail=self.detail, errors=self.errors).model_dump_json().encode()


def token_refusal(authorization: str, settings: Settings) -> Refusal | None:
    if bearer_token_accepted(authorization, settings):
        return None
    return Refusal(401, "unauthorized",
                   "this endpoint needs 'Authorization: Bearer <token>' with the service's CAPWATCH_TOKEN",
                   headers={"WWW-Authenticate": "Bearer"})


def is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def origin_refusal(origin: str | None, host: str | None) -> Refusal | None:
    """A browser sends ``Origin`` with a POST: only the service's own page (same scheme-less host and
    port as the request's ``Host``) may write; ranks send no ``Origin`` at all."""
    if origin is None:
        return None
    try:
        origin_host = urlsplit(origin).netloc.lower()
    except ValueError:  # not a URL at all ("http://[::1"): from no page of this service
        origin_host = None
    if origin != "null" and host is not None and origin_host == host.strip().lower():
        return None
    return Refusal(403, "unauthorized", f"reports come from ranks, not from web pages (Origin {origin[:100]!r})")


def header_refusal(authorization: str, content_type: str | None, declared_length: str | None,
                   settings: Settings, origin: str | None = None, host: str | None = None) -> Refusal | None:
    """Rules 1-3 as far as the headers tell (``authorization`` is the one header: two are refused
    before any route, see ``capwatch.service.api.guard``)."""
    refusal = token_refusal(authorization, settings) or origin_refusal(origin, host)
    if refusal is not None:
        return refusal
    if content_type is None or not is_json(content_type):
        return Refusal(415, "unsupported_media_type",
                       f"reports are JSON: send 'Content-Type: application/json' (got {content_type or 'none'!r})")
    if declared_length is not None and (not declared_length.isdigit() or int(declared_length) > settings.max_body_bytes):
        return too_large(settings)
    return None


def too_large(settings: Settings) -> Refusal:
    return Refusal(413, "too_large", f"request body exceeds {settings.max_body_bytes} bytes (CAPWATCH_MAX_BODY_BYTES); "
                                     "report shorter intervals")


# What a body may bring before it needs a slot: uvicorn's own read buffer (its flow-control high-water mark), so a
# body in its grace holds no more than the connection would hold anyway.
SLOTLESS_BODY_BYTES = 64 << 10


@dataclass
class _Body:
    """What has arrived of one request body; kept outside the reading coroutine so a read cut off at the grace
    continues where it stopped (uvicorn's ``receive`` consumes nothing when cancelled while it waits)."""
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    complete: bool = False
    connected: bool = True

    def result(self) -> tuple[bytes, bool]:
        return b"".join(self.chunks), self.connected


class _Slot:
    """One body holding a slot: whose, how far it came, and its reading task (cancelled to preempt it)."""

    def __init__(self, client: str | None, body: _Body, started: float):
        self.client, self.body, self.started = client, body, started
        self.task: asyncio.Future | None = None
        self.preempted = False
        self.cut: asyncio.Future = asyncio.get_running_loop().create_future()  # set when it gives its slot up

    def rate(self, now: float) -> float:
        """Bytes a second since its headers."""
        return self.body.size / max(now - self.started, 1e-3)

    def preempt(self) -> None:
        self.preempted = True
        if not self.cut.done():
            self.cut.set_result(None)


class BodyGate:
    """Receives request bodies: bounded in size and time, and in how many are waited for at once, overall and per
    client address. One per app, used from its event loop only.

    A slot is what a body that has not arrived costs: the wait, and what has come of it so far. A body that
    follows its headers within ``body_grace_s`` (a rank's report: Python's http.client writes the headers and the
    body in two sends, which a busy server or a real network can read apart) and brings at most
    ``SLOTLESS_BODY_BYTES`` takes none. So clients that declare a body and trickle it hold slots, and are cut off
    at ``body_timeout_s``, but never keep an honest rank's report out; each address holds at most
    ``max_bodies_per_client`` slots, so one host's slow clients leave the rest to others."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.receiving = 0
        self._by_client: dict[str | None, int] = {}
        self._slots: dict[_Slot, None] = {}  # the bodies holding a slot, oldest first

    def _take_slot(self, client: str | None, newcomer: _Slot) -> Refusal | None:
        settings = self.settings
        held = self._by_client.get(client, 0)
        if held >= settings.max_bodies_per_client:
            if not self._preempt(newcomer, client):
                return Refusal(503, "too_slow",
                               f"{held} request bodies from {client or 'this client'} are being received already, "
                               "its share (CAPWATCH_MAX_BODIES_PER_CLIENT); retry shortly",
                               headers={"Retry-After": "1", "Connection": "close"})
        elif self.receiving >= settings.max_concurrent_bodies and not self._preempt(newcomer, None):
            return Refusal(503, "too_slow",
                           f"{self.receiving} request bodies are being received already (CAPWATCH_MAX_CONCURRENT_BODIES); "
                           "retry shortly", headers={"Retry-After": "1", "Connection": "close"})
        self.receiving += 1
        self._by_client[client] = self._by_client.get(client, 0) + 1
        self._slots[newcomer] = None
        return None

    def _preempt(self, newcomer: _Slot, client: str | None) -> bool:
        """Free a slot for ``newcomer`` by cutting off the slowest body holding one (of ``client``, or of anyone),
        if it arrives at under a quarter of the newcomer's pace: a body paced as a network delivers it is not
        starved by clients that trickle theirs (issue 36, F22). The one cut off is answered 408."""
        now = asyncio.get_running_loop().time()
        candidates = [slot for slot in self._slots if not slot.preempted and (client is None or slot.client == client)]
        if not candidates:
            return False
        slowest = min(candidates, key=lambda slot: slot.rate(now))
        if slowest.rate(now) * 4 >= newcomer.rate(now):
            return False
        slowest.preempt()
        self._release_slot(slowest)
        return True

    def _release_slot(self, slot: _Slot) -> None:
        if self._slots.pop(slot, False) is not None:
            return  # released already (preempted)
        self.receiving -= 1
        held = self._by_client.pop(slot.client) - 1
        if held:
            self._by_client[slot.client] = held

    async def read(self, receive: Receive, client: str | None = None) -> tuple[bytes, bool] | Refusal:
        """The body and whether the client is still there (False: it disconnected), or a refusal."""
        settings, body = self.settings, _Body()
        started = asyncio.get_running_loop().time()
        try:
            refusal = await asyncio.wait_for(self._receive(body, receive, SLOTLESS_BODY_BYTES), settings.body_grace_s)
        except TimeoutError:
            refusal = None  # not all here within the grace: what is missing needs a slot
        if refusal is not None or body.complete:
            return refusal or body.result()
        slot = _Slot(client, body, started)
        refusal = self._take_slot(client, slot)
        if refusal is not None:
            return refusal
        loop = asyncio.get_running_loop()
        slot.task = asyncio.ensure_future(self._receive(body, receive, settings.max_body_bytes))
        try:
            left_s = settings.body_timeout_s - (loop.time() - started)
            done, _ = await asyncio.wait({slot.task, slot.cut}, timeout=max(left_s, 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if slot.task not in done:
                if slot.cut in done:
                    return Refusal(408, "too_slow", "the request body arrived too slowly while a faster one waited "
                                                    "for its slot (CAPWATCH_MAX_CONCURRENT_BODIES); send it at once",
                                   headers={"Connection": "close"})
                return Refusal(408, "too_slow", f"the request body did not arrive within {settings.body_timeout_s:g} "
                                                "s (CAPWATCH_BODY_TIMEOUT_S)", headers={"Connection": "close"})
            refusal = slot.task.result()
        finally:
            if not slot.task.done():
                slot.task.cancel()
            self._release_slot(slot)
        return refusal or body.result()

    async def _receive(self, body: _Body, receive: Receive, until_bytes: int) -> Refusal | None:
        """Adds to ``body`` until it is complete or holds more than ``until_bytes``; a refusal if it is too large."""
        while not body.complete and body.size <= until_bytes:
            message: Message = await receive()
            if message["type"] != "http.request":
                body.complete, body.connected = True, False  # the client went away
                return None
            chunk = message.get("body", b"")
            body.size += len(chunk)
            if body.size > self.settings.max_body_bytes:
                return too_large(self.settings)
            body.chunks.append(chunk)
            body.complete = not message.get("more_body", False)
        return None


# A rank's clock may drift this far from the service's before its reports are refused: well above
# NTP error and the reporter's retry backoff, well below what distorts a window of samples.
CLOCK_TOLERANCE_S = 600.0


def clock_tolerance_s(window_s: float) -> float:
    return max(CLOCK_TOLERANCE_S, 2 * window_s)


def clock_errors(report: RankReport, received_unix_s: float, window_s: float, retention_s: float) -> list[FieldError]:
    """The report's times that the service's clock contradicts (empty when they are plausible).
    Samples are bucketed by the rank's own interval times, so one report with a wrong clock (say
    ``end_unix_s=0``) would stretch the history to decades and move the advice. Each time must lie
    at most ``clock_tolerance_s`` after the receive time and at most the retention before it: the
    past side is wider because the reporter holds reports back while the service is unreachable
    and sends them late (as does a back-filling simulation), and such reports are genuine."""
    tolerance = clock_tolerance_s(window_s)
    oldest, newest = received_unix_s - retention_s, received_unix_s + tolerance
    errors = []
    for name, value in (("sent_unix_s", report.sent_unix_s), ("interval.start_unix_s", report.interval.start_unix_s),
                        ("interval.end_unix_s", report.interval.end_unix_s)):
        if not oldest <= value <= newest:
            errors.append(FieldError(
                field=name, type="clock_skew",
                message=(f"{value:.0f} is {value - received_unix_s:+.0f} s from the service's clock, which allows "
                         f"{retention_s:.0f} s before (retention_s) and {tolerance:.0f} s after; "
                         "synchronise the rank's clock (NTP)")))
    return errors


def invalid(errors: list[FieldError]) -> Refusal:
    detail = "invalid report: " + "; ".join(f"{item.field}: {item.message}" for item in errors[:5])
    return Refusal(422, "invalid", detail, errors)


def _field_errors(error: ValidationError) -> list[FieldError]:
    return [FieldError(field=".".join(str(part) for part in item["loc"]) or "body",
                       message=item["msg"], type=item["type"]) for item in error.errors(include_url=False)]


def _schema_refusal(errors: list[FieldError]) -> Refusal:
    if any(item.type == "json_invalid" for item in errors):
        return Refusal(422, "malformed", "the body is not valid JSON", errors)
    return invalid(errors)


def parse_report(body: bytes, received_unix_s: float, settings: Settings) -> RankReport | Refusal:
    """Rules 4 and 5: the report, or why not."""
    try:
        report = RankReport.model_validate_json(body)
    except ValidationError as error:
        return _schema_refusal(_field_errors(error))
    errors = clock_errors(report, received_unix_s, settings.window_s, settings.retention_s)
    return invalid(errors) if errors else report


def schema_errors(body: bytes) -> list[dict] | None:
    """Rule 4 alone, in ``HeavyBodies``' worker process: None when the body is a valid report, else its errors
    (``FieldError``'s fields: plain data crosses the process boundary cheaply)."""
    try:
        RankReport.model_validate_json(body)
    except ValidationError as error:
        return [item.model_dump() for item in _field_errors(error)]
    return None


# Bodies larger than this are validated off the event loop (``HeavyBodies``): ~10 ms of validation here; a
# 4 MB report with a 350,000-bin histogram takes ~400 ms, most of it in pydantic's compiled code, which holds the
# GIL, so not even another thread of this process lets the loop run meanwhile (issue 36, F16).
HEAVY_BODY_BYTES = 128 << 10
# Heavy bodies received and waiting for their validation at once: each holds its body (up to max_body_bytes).
HEAVY_BODIES_WAITING = 8


class HeavyBodies:
    """Validates large report bodies in one worker process, one at a time, so a client posting multi-MB reports
    that fail validation at their end costs the others nothing: a rank's report and ``/healthz`` are answered
    on the loop meanwhile. A body found valid there is parsed again here, in a thread (an honest report that
    large is rare; its objects must live in this process); one found invalid is refused with the same answer as
    on the loop. At most ``HEAVY_BODIES_WAITING`` wait (503 past it). The process starts at the first heavy body;
    one per app (``app.state.heavy_bodies``), used from its event loop; ``close`` at shutdown."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.waiting = 0
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._turn: asyncio.Lock | None = None

    async def parse(self, body: bytes, received_unix_s: float) -> RankReport | Refusal:
        """``parse_report``'s answer, from the loop for a small body, else off it."""
        if len(body) <= HEAVY_BODY_BYTES:
            return parse_report(body, received_unix_s, self.settings)
        if self.waiting >= HEAVY_BODIES_WAITING:
            return Refusal(503, "unavailable", f"{self.waiting} reports over {HEAVY_BODY_BYTES >> 10} KiB are waiting "
                                               "for validation already; retry shortly",
                           headers={"Retry-After": "1"})
        self.waiting += 1
        try:
            self._turn = self._turn or asyncio.Lock()
            async with self._turn:
                errors = await self._schema_errors(body)
                if errors is not None:
                    return _schema_refusal([FieldError(**item) for item in errors])
                return await asyncio.to_thread(parse_report, body, received_unix_s, self.settings)
        finally:
            self.waiting -= 1

    async def _schema_errors(self, body: bytes) -> list[dict] | None:
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return await loop.run_in_executor(self._pool, schema_errors, body)
        except concurrent.futures.process.BrokenProcessPool:  # the worker died (killed, out of memory): a new one
            self._pool = None  # next time; this body is validated here, in a thread
            log.warning("the process validating large reports ended; starting another for the next one")
            return await asyncio.to_thread(schema_errors, body)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def json_detail(detail: str) -> bytes:
    return json.dumps({"detail": detail}).encode()
