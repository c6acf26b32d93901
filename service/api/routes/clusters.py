"""``/v1/clusters``: the aggregated view of each EP group, and its recent history."""

from __future__ import annotations

from typing import Annotated

from capwatch.service.api.deps import ClockDep, DigestsDep, RoleQuery, SettingsDep, SourceDep
from capwatch.service.api.history_stream import HistoryWorkers, history_json
from capwatch.service.api.streaming import shared_answer
from capwatch.service.cluster_view import ClusterView
from capwatch.service.digests import ClusterSummary
from capwatch.service.queries import cluster_view, role_states
from capwatch.telemetry.report import NAME_PATTERN, not_a_relative_path
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, BaseModel

router = APIRouter(prefix="/v1/clusters", tags=["clusters"])
ClusterName = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME_PATTERN),
                        AfterValidator(not_a_relative_path)]


class HistoryPoint(BaseModel):
    interval_end_unix_s: float
    peak_runtime_tokens: int
    cap: int
    utilization: float
    forward_steps: int
    overflow_events: int
    max_local_tokens: int | None = None  # the rank's own largest local batch (None: the rank does not report it)


class RankSeries(BaseModel):
    ep_rank: int
    points: list[HistoryPoint]


class GroupPoint(BaseModel):
    window_start_unix_s: float
    peak_runtime_tokens: int
    cap: int
    utilization: float
    overflow_events: int
    ranks: int


class ClusterHistory(BaseModel):
    cluster: str
    role: str
    since_unix_s: float
    until_unix_s: float
    window_s: float
    truncated: bool
    ranks: list[RankSeries]
    group: list[GroupPoint]


def not_found(error: LookupError) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, str(error.args[0] if error.args else error))


@router.get("", response_model=list[ClusterSummary], summary="Every EP group with a one-line summary",
            description=("A group whose advice cannot be computed is listed with its error (and no action); "
                         "the others are unaffected. Each group is recomputed only when it changed."))
def list_clusters(digests: DigestsDep) -> Response:
    # Joined once per change of the list (capwatch.service.digests) and shared by every client, handed out a piece
    # at a time as the client reads: a client that does not read holds no copy of it.
    return shared_answer([digests.list_json()], "application/json")


@router.get("/{cluster}", response_model=ClusterView, summary="Ranks, group peaks and consistency findings",
            responses={404: {"description": "Unknown cluster or role"}})
def get_cluster(cluster: ClusterName, source: SourceDep, settings: SettingsDep, clock: ClockDep,
                role: RoleQuery = "target") -> ClusterView:
    try:
        return cluster_view(source, cluster, role, clock(), settings)
    except LookupError as error:
        raise not_found(error) from None


@router.get("/{cluster}/history", response_model=ClusterHistory,
            summary="Per-rank interval peaks and the group's peak per window (raw reports kept for the retention)",
            responses={404: {"description": "Unknown cluster or role"}})
async def get_history(
    request: Request, cluster: ClusterName, source: SourceDep, settings: SettingsDep, clock: ClockDep,
    role: RoleQuery = "target",
    since_s: Annotated[float, Query(ge=0, le=1e11, description="Unix seconds; default: one hour before until")] = 0.0,
    until_s: Annotated[float, Query(ge=0, le=1e11, description="Unix seconds; default: now")] = 0.0,
    limit: Annotated[int, Query(ge=1, le=100_000, description="Most rank intervals returned (newest kept)")] = 20_000,
) -> Response:
    workers: HistoryWorkers = request.app.state.history_workers
    try:
        await workers.call(role_states, source, cluster, role)  # the group exists
    except LookupError as error:
        raise not_found(error) from None
    until = until_s or clock()
    since = since_s or until - 3600.0
    if since > until:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "since_s must not be after until_s")
    pieces = await workers.call(history_json, source, cluster, role, since, until, limit, settings.window_s)
    # Streamed a page of rows at a time (history_stream.py), each piece made in the history's own workers: a
    # request holds a page, never the whole range, and a crowd of slow readers cannot starve the other routes.
    return StreamingResponse(workers.pieces(pieces), media_type="application/json")
