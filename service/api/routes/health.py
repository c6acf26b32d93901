"""``/healthz``: liveness plus which source the service reads."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    source: str  # "sqlite" or "prometheus"


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz(request: Request) -> Health:
    return Health(status="ok", source="sqlite" if request.app.state.store is not None else "prometheus")
