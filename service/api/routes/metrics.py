"""``/metrics``: the service's own metrics and per-cluster cap gauges, for Prometheus."""

from __future__ import annotations

from capwatch.service.api.streaming import shared_answer
from capwatch.service.metrics import exposition
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, summary="Prometheus exposition",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    # Streamed from the bytes the service holds (capwatch.service.api.streaming): no copy per slow scraper.
    return shared_answer(exposition(request.app.state.metrics), CONTENT_TYPE_LATEST)
