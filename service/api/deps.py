"""Dependencies as ``Annotated`` aliases: routes declare what they need, the app provides it.
All are ``async def``: FastAPI runs a sync dependency in the threadpool, one thread hop per
dependency per request, which cost the ingest path most of its throughput."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated

from capwatch.service.config import Settings
from capwatch.service.digests import GroupDigests
from capwatch.service.metrics import ServiceMetrics
from capwatch.service.sources.contract import ClusterSource
from fastapi import Depends, Query, Request

from capwatch.vocabulary import ROLES


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_source(request: Request) -> ClusterSource:
    return request.app.state.source


async def get_clock(request: Request) -> Callable[[], float]:
    return request.app.state.clock


async def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


async def get_digests(request: Request) -> GroupDigests:
    return request.app.state.digests


SettingsDep = Annotated[Settings, Depends(get_settings)]
SourceDep = Annotated[ClusterSource, Depends(get_source)]
ClockDep = Annotated[Callable[[], float], Depends(get_clock)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
DigestsDep = Annotated[GroupDigests, Depends(get_digests)]
# Built from the one vocabulary, so a role added there (sp_prefill) can be asked for here too.
RoleQuery = Annotated[str, Query(pattern=f"^({'|'.join(ROLES)})$", description="Which dispatcher of the ranks.")]


def bearer_token_accepted(authorization: str, settings: Settings) -> bool:
    """True when no token is configured, or ``authorization`` is ``Bearer <the token>``."""
    if settings.token is None:
        return True
    scheme, _, supplied = authorization.partition(" ")
    expected = settings.token.get_secret_value()
    return scheme.lower() == "bearer" and hmac.compare_digest(supplied.strip().encode(), expected.encode())
