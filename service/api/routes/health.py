"""``/healthz``: liveness plus which source the service reads."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    source: str  # "sqlite" or "prometheus"


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz(request: Request) -> Health:
    # On the event loop, not in the thread pool: it answers while every pool thread is busy with reads.
    return Health(status="ok", source="sqlite" if request.app.state.store is not None else "prometheus")
