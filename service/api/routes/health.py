"""``/healthz``: liveness plus which source the service reads, and whether its database file is still the one it
opened (``degraded``, with what happened: the process is alive, but takes no report; a restart would start an
empty database if the file was deleted, so this says so instead of failing the probe)."""

from __future__ import annotations

from capwatch.service.api.guard import HOST_NOT_ALLOWED
from fastapi import APIRouter, Request
from pydantic import BaseModel

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str  # "ok", or "degraded" when the database file was lost (see ``problem``)
    source: str  # "sqlite" or "prometheus"
    problem: str | None = None


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz(request: Request) -> Health:
    # On the event loop, not in the thread pool: it answers while every pool thread is busy with reads.
    store = request.app.state.store
    if store is None:
        return Health(status="ok", source="prometheus")
    lost = store.lost
    shown = None if request.scope.get(HOST_NOT_ALLOWED) else lost  # the words name the file: allowed hosts only
    return Health(status="degraded" if lost else "ok", source="sqlite", problem=shown)
