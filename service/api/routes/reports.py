"""``POST /v1/reports``: one rank's interval report, validated strictly, acknowledged once durable.

Two ways in, one set of rules (``capwatch.service.api.report_rules``): ``ReportFastPath`` answers a
request whose size is declared without FastAPI's routing, request and dependency machinery (which
cost the ingest path most of its CPU, profiled with py-spy; benchmarks/ingest.py); ``post_report``,
the documented route, answers the others (a chunked body). Both apply the same rules in the same
order and answer each refusal with the same status and body."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from capwatch.service.api.report_rules import (BodyGate, Refusal, RejectedReport, clock_tolerance_s,  # noqa: F401
                                               header_refusal, json_detail, parse_report)
from capwatch.service.store.errors import ReportNotStorable, StoreFull, StoreUnavailable
from capwatch.telemetry.report import RankReport

router = APIRouter(prefix="/v1", tags=["reports"])
# The request headers the rules read (raw ASGI name -> name).
_WANTED = {name.encode(): name for name in ("authorization", "content-type", "content-length", "origin", "host")}


class IngestResponse(BaseModel):
    accepted: bool
    duplicate: bool


ACCEPTED_BODY = IngestResponse(accepted=True, duplicate=False).model_dump_json().encode()
DUPLICATE_BODY = IngestResponse(accepted=True, duplicate=True).model_dump_json().encode()


async def answer(state, headers: dict[str, str], receive: Receive, started: float,
                 client: str | None) -> tuple[int, bytes, dict]:
    """Every rule, then the store: the status, body and extra headers of the answer. Both ways in."""
    settings, metrics = state.settings, state.metrics
    refusal = header_refusal(headers.get("authorization", ""), headers.get("content-type"),
                             headers.get("content-length"), settings, headers.get("origin"), headers.get("host"))
    if refusal is None:
        read = await state.body_gate.read(receive, client)
        if isinstance(read, Refusal):
            refusal = read
        else:
            body, connected = read
            received = state.clock()
            parsed = (await state.heavy_bodies.parse(body, received) if connected
                      else Refusal(400, "malformed", "client left"))
            refusal = parsed if isinstance(parsed, Refusal) else None
    if refusal is None and state.store is None:
        refusal = Refusal(503, "unavailable",
                          "this service reads its ranks from Prometheus (--prometheus-url); it stores no reports")
    if refusal is not None:
        metrics.reports_rejected.labels(refusal.reason).inc()
        return refusal.status, refusal.body(), refusal.headers
    return await _acknowledge(state, parsed, received, body, started)


async def _acknowledge(state, report: RankReport, received_unix_s: float, body: bytes,
                       started: float) -> tuple[int, bytes, dict]:
    """Store a valid report; the acknowledgement once it is durable (or why it was not stored)."""
    metrics = state.metrics
    try:
        result = await state.store.submit_async(report, received_unix_s, payload=body)
    except StoreUnavailable as error:
        metrics.reports_rejected.labels("unavailable").inc()
        return (status.HTTP_503_SERVICE_UNAVAILABLE, json_detail(f"{error}; retry later"),
                {"Retry-After": str(error.retry_after_s)})
    except StoreFull as error:  # a 4xx a rank retries (429): it keeps the report buffered until there is room
        metrics.reports_rejected.labels("full").inc()
        return (status.HTTP_429_TOO_MANY_REQUESTS, Refusal(429, "full", str(error)).body(),
                {"Retry-After": str(error.retry_after_s)})
    except ReportNotStorable as error:
        metrics.reports_rejected.labels("invalid").inc()
        return status.HTTP_422_UNPROCESSABLE_CONTENT, Refusal(422, "invalid", str(error)).body(), {}
    if result.duplicate:
        metrics.reports_duplicate.inc()
        answer_ = (status.HTTP_200_OK, DUPLICATE_BODY, {})
    else:
        metrics.reports_ingested.inc()
        answer_ = (status.HTTP_202_ACCEPTED, ACCEPTED_BODY, {})
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return answer_


@router.post(
    "/reports", status_code=status.HTTP_202_ACCEPTED, response_model=IngestResponse,
    summary="Store one rank's interval report",
    description=("Validated with telemetry.report.RankReport (strict), after the token, Content-Type "
                 "(application/json only) and size; the rules: capwatch.service.api.report_rules. 202 once durably "
                 "committed; 200 for a duplicate (same cluster, role, rank, boot_id and sequence), which is "
                 "acknowledged and ignored."),
    responses={200: {"model": IngestResponse, "description": "Duplicate: already stored"},
               401: {"model": RejectedReport, "description": "Missing or wrong bearer token (when the service has one)"},
               403: {"model": RejectedReport, "description": "Sent by a web page of another origin"},
               408: {"model": RejectedReport, "description": "The body did not arrive within body_timeout_s"},
               413: {"model": RejectedReport, "description": "Body too large"},
               429: {"model": RejectedReport, "description": (
                   "Not stored: the report would add a cluster or a rank past the service's bounds "
                   "(CAPWATCH_MAX_CLUSTERS, CAPWATCH_MAX_RANKS); Retry-After says when to try again")},
               415: {"model": RejectedReport, "description": "Not application/json"},
               422: {"model": RejectedReport, "description": (
                   "Invalid report (a field, a release or layout the rank's A2A backend would refuse), or times the service's "
                   "clock contradicts (rank clock off by more than max(600 s, 2 x window_s)): nothing stored")},
               503: {"description": ("Not stored: the store is unavailable or full, or too many bodies are being "
                                     "received (Retry-After says when to retry), or the service reads Prometheus")}},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/RankReport"}}}}},
)
async def post_report(request: Request) -> Response:
    """The documented way in, reached only by a body of undeclared size (chunked): a request with a
    Content-Length, every rank's report, is answered before routing by ``ReportFastPath`` below."""
    started = time.perf_counter()
    headers = {name: request.headers.get(name) for name in _WANTED.values()}
    status_code, body, extra = await answer(request.app.state, {k: v for k, v in headers.items() if v is not None},
                                            request.receive, started, request.client.host if request.client else None)
    return Response(body, status_code=status_code, media_type="application/json", headers=extra)


class ReportFastPath:
    """ASGI middleware answering ``POST /v1/reports`` with a declared size, through the same ``answer``
    as the route (see the module's docstring); everything else goes on to the app. Installed by
    ``capwatch.service.main.create_app``, inside ``RequestGuard``."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] != scope.get("root_path", "") + "/v1/reports"):
            await self.app(scope, receive, send)
            return
        headers = {}
        for name, value in scope["headers"]:
            wanted = _WANTED.get(name)
            if wanted is not None:
                headers[wanted] = value.decode("latin-1")
        if "content-length" not in headers:  # a chunked body: the route's way in
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        client = scope.get("client")
        status_code, body, extra = await answer(scope["app"].state, headers, receive, started,
                                                client[0] if client else None)
        response_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *((name.lower().encode(), value.encode()) for name, value in extra.items())]
        await send({"type": "http.response.start", "status": status_code, "headers": response_headers})
        await send({"type": "http.response.body", "body": body})
