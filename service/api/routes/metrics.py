"""``/metrics``: the service's own metrics and per-cluster cap gauges, for Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from capwatch.service.metrics import exposition

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, summary="Prometheus exposition",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    return Response(exposition(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
