"""``POST /v1/reports``: one rank's interval report, validated strictly, acknowledged once durable."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from service.api.deps import check_token
from service.store.sqlite import StoreUnavailable
from telemetry.report import RankReport

router = APIRouter(prefix="/v1", tags=["reports"])


class IngestResponse(BaseModel):
    accepted: bool
    duplicate: bool


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
               422: {"model": RejectedReport, "description": "Invalid report: nothing stored"},
               503: {"description": "Not stored: the store is unavailable or the service reads Prometheus"}},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/RankReport"}}}}},
)
async def post_report(request: Request, response: Response) -> IngestResponse | JSONResponse:
    # The hot path takes what it needs from app.state directly: resolving injected dependencies
    # cost a measurable share of the ingest rate (see benchmarks/ingest.py).
    started = time.perf_counter()
    state = request.app.state
    settings, metrics, clock = state.settings, state.metrics, state.clock
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
        detail = ("the body is not valid JSON" if malformed else
                  "invalid report: " + "; ".join(f"{item.field}: {item.message}" for item in errors[:5]))
        return JSONResponse(RejectedReport(detail=detail, errors=errors).model_dump(),
                            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
    store = request.app.state.store
    if store is None:
        metrics.reports_rejected.labels("unavailable").inc()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "this service reads its ranks from Prometheus (--prometheus-url); it stores no reports")
    try:
        result = await store.submit_async(report, clock(), payload=body)
    except StoreUnavailable as error:
        metrics.reports_rejected.labels("unavailable").inc()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"{error}; retry later") from None
    if result.duplicate:
        metrics.reports_duplicate.inc()
        response.status_code = status.HTTP_200_OK
    else:
        metrics.reports_ingested.inc()
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return IngestResponse(accepted=True, duplicate=result.duplicate)
