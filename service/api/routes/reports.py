"""``POST /v1/reports``: one rank's interval report, validated strictly, acknowledged once durable."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capwatch.service.api.deps import bearer_token_accepted, check_token
from capwatch.service.store.sqlite import StoreUnavailable
from capwatch.telemetry.report import RankReport

router = APIRouter(prefix="/v1", tags=["reports"])


class IngestResponse(BaseModel):
    accepted: bool
    duplicate: bool


ACCEPTED_BODY = IngestResponse(accepted=True, duplicate=False).model_dump_json().encode()
DUPLICATE_BODY = IngestResponse(accepted=True, duplicate=True).model_dump_json().encode()


class FieldError(BaseModel):
    field: str
    message: str
    type: str


class RejectedReport(BaseModel):
    detail: str
    errors: list[FieldError] = []


async def read_bounded_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` (never read in full)."""
    def too_large() -> HTTPException:  # built only when needed: an HTTPException costs ~0.1 ms to make
        return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                             f"request body exceeds {limit} bytes (CAPWATCH_MAX_BODY_BYTES); report shorter intervals")

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large()
        chunks.append(chunk)
    return b"".join(chunks)


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


def _clock_errors(state, report: RankReport, received_unix_s: float) -> list[FieldError]:
    settings = state.settings
    return clock_errors(report, received_unix_s, settings.window_s, settings.retention_s)


def _rejection(errors: list[FieldError]) -> JSONResponse:
    detail = "invalid report: " + "; ".join(f"{item.field}: {item.message}" for item in errors[:5])
    return JSONResponse(RejectedReport(detail=detail, errors=errors).model_dump(),
                        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def _field_errors(error: ValidationError) -> list[FieldError]:
    return [FieldError(field=".".join(str(part) for part in item["loc"]) or "body",
                       message=item["msg"], type=item["type"]) for item in error.errors(include_url=False)]


@router.post(
    "/reports", status_code=status.HTTP_202_ACCEPTED, response_model=IngestResponse,
    summary="Store one rank's interval report",
    description=("Validated with telemetry.report.RankReport (strict). 202 once durably committed; 200 for a "
                 "duplicate (same cluster, role, rank, boot_id and sequence), which is acknowledged and ignored."),
    responses={200: {"model": IngestResponse, "description": "Duplicate: already stored"},
               401: {"description": "Missing or wrong bearer token (when the service has one)"},
               413: {"description": "Body too large"},
               422: {"model": RejectedReport, "description": (
                   "Invalid report, or times the service's clock contradicts (rank clock off by more than "
                   "max(600 s, 2 x window_s)): nothing stored")},
               503: {"description": ("Not stored: the store is unavailable or full (Retry-After says when to "
                                     "retry), or the service reads Prometheus")}},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/RankReport"}}}}},
)
async def post_report(request: Request) -> Response:
    # The hot path takes what it needs from app.state directly: resolving injected dependencies
    # cost a measurable share of the ingest rate (see benchmarks/ingest.py).
    started = time.perf_counter()
    state = request.app.state
    settings, metrics = state.settings, state.metrics
    check_token(request, settings, metrics)
    try:
        body = await read_bounded_body(request, settings.max_body_bytes)
    except HTTPException:
        metrics.reports_rejected.labels("too_large").inc()
        raise
    try:
        report = RankReport.model_validate_json(body)
    except ValidationError as error:
        errors = _field_errors(error)
        malformed = any(item.type == "json_invalid" for item in errors)
        metrics.reports_rejected.labels("malformed" if malformed else "invalid").inc()
        if malformed:
            return JSONResponse(RejectedReport(detail="the body is not valid JSON", errors=errors).model_dump(),
                                status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
        return _rejection(errors)
    received = state.clock()
    errors = _clock_errors(state, report, received)
    if errors:
        metrics.reports_rejected.labels("invalid").inc()
        return _rejection(errors)
    if state.store is None:
        metrics.reports_rejected.labels("unavailable").inc()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "this service reads its ranks from Prometheus (--prometheus-url); it stores no reports")
    try:
        status_code, acknowledgement = await _acknowledge(state, report, received, body, started)
    except StoreUnavailable as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"{error}; retry later",
                            headers={"Retry-After": str(error.retry_after_s)}) from None
    return Response(acknowledgement, status_code=status_code, media_type="application/json")


async def _acknowledge(state, report: RankReport, received_unix_s: float, body: bytes,
                       started: float) -> tuple[int, bytes]:
    """Store a valid report; the acknowledgement's status and (pre-encoded) body once it is durable.
    Raises StoreUnavailable (counted) when it was not stored."""
    metrics = state.metrics
    try:
        result = await state.store.submit_async(report, received_unix_s, payload=body)
    except StoreUnavailable:
        metrics.reports_rejected.labels("unavailable").inc()
        raise
    if result.duplicate:
        metrics.reports_duplicate.inc()
        acknowledgement = (status.HTTP_200_OK, DUPLICATE_BODY)
    else:
        metrics.reports_ingested.inc()
        acknowledgement = (status.HTTP_202_ACCEPTED, ACCEPTED_BODY)
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return acknowledgement


_JSON_HEADERS = [(b"content-type", b"application/json")]


class ReportFastPath:
    """ASGI middleware that serves the common case of ``POST /v1/reports`` — token accepted, size
    declared and within bounds, valid report, a store present — without FastAPI's routing, request
    and dependency machinery, which cost the ingest path most of its CPU (profiled with py-spy;
    benchmarks/ingest.py). Every other request, and every error, goes on to ``post_report`` above with
    the body replayed, so there is one definition of each refusal (a report whose times the service's
    clock contradicts, ``clock_errors``, goes on too); the only answer made here besides the
    acknowledgement is the 503 of a report handed to a store that then could not take or commit it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] != scope.get("root_path", "") + "/v1/reports"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope["app"].state
        declared, authorization = None, ""
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
            elif name == b"authorization":
                authorization = value.decode("latin-1")
        limit = state.settings.max_body_bytes
        if (state.store is None or declared is None or not declared.isdigit() or int(declared) > limit
                or not bearer_token_accepted(authorization, state.settings)):
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more and size <= limit:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: the route sees the same
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            report = None if more or size > limit else RankReport.model_validate_json(body)
        except ValidationError:
            report = None
        received = state.clock()
        if report is None or _clock_errors(state, report, received):  # the route refuses it
            await self.app(scope, _replay(body, more, receive), send)
            return
        headers = _JSON_HEADERS
        try:
            status_code, acknowledgement = await _acknowledge(state, report, received, body, started)
        except StoreUnavailable as error:
            status_code = status.HTTP_503_SERVICE_UNAVAILABLE
            acknowledgement = json.dumps({"detail": f"{error}; retry later"}).encode()
            headers = [*_JSON_HEADERS, (b"retry-after", str(error.retry_after_s).encode())]
        await send({"type": "http.response.start", "status": status_code,
                    "headers": [*headers, (b"content-length", str(len(acknowledgement)).encode())]})
        await send({"type": "http.response.body", "body": acknowledgement})


def _replay(body: bytes, more_body: bool, receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: what was read first, then the rest of the stream."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": more_body}

    return replay
