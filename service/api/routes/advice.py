"""``/v1/clusters/{cluster}/advice`` and ``/whatif``: the advisor over the group's history. The advice is the
group's digest (``capwatch.service.digests``: recomputed only when the group's data changed, never stale); a
what-if prices the caps asked for, on the same data."""

from __future__ import annotations

from typing import Annotated

from capwatch.advisor.advice import ClusterAdvice, WhatIf
from capwatch.backends import DEFAULT_BACKEND
from capwatch.service.api.deps import ClockDep, DigestsDep, RoleQuery, SettingsDep, SourceDep
from capwatch.service.api.routes.clusters import ClusterName, not_found
from capwatch.service.queries import AdviceUnavailable, cluster_whatif
from capwatch.sizing.checks import SizingError
from fastapi import APIRouter, HTTPException, Query, status

router = APIRouter(prefix="/v1/clusters", tags=["advice"])


UNAVAILABLE = {409: {"description": "The cluster's ranks report configurations that cannot be priced or "
                                      "advised together (the detail says why); other clusters are unaffected"}}


def unavailable(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_409_CONFLICT, detail)


@router.get("/{cluster}/advice", response_model=ClusterAdvice, summary="Raise, lower or hold the cap, and why",
            responses={404: {"description": "Unknown cluster or role"}, **UNAVAILABLE})
def get_advice(cluster: ClusterName, digests: DigestsDep, clock: ClockDep,
               role: RoleQuery = "target") -> ClusterAdvice:
    now = clock()
    try:
        digest = digests.group(cluster, role, now)
    except LookupError as error:
        raise not_found(error) from None
    if digest.advice is None:
        raise unavailable(digest.error)
    return ClusterAdvice.of_group(digest.advice, cluster, role, generated_unix_s=now)


@router.get("/{cluster}/whatif", response_model=list[WhatIf],
            summary="Predicted overflow rate and workspace bytes for given caps",
            responses={404: {"description": "Unknown cluster or role"}, **UNAVAILABLE})
def get_whatif(
    cluster: ClusterName, source: SourceDep, settings: SettingsDep, clock: ClockDep,
    cap: Annotated[list[int], Query(min_length=1, max_length=64, description="Caps to price (repeat the parameter)")],
    role: RoleQuery = "target",
) -> list[WhatIf]:
    for value in cap:
        try:
            DEFAULT_BACKEND.rules.check_cap(value)  # the one range of caps (the widest: capwatch's), the page's too
        except SizingError as error:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    try:
        return cluster_whatif(source, cluster, role, cap, clock(), settings)
    except SizingError as error:  # a cap outside the group's backend range (DeepEP's 1..1024)
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    except LookupError as error:
        raise not_found(error) from None
    except AdviceUnavailable as error:
        raise unavailable(str(error)) from None
