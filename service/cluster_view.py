"""``ClusterView``, what ``GET /v1/clusters/{cluster}`` answers: one view of an EP group (a cluster's ranks of one
role) from its ranks' latest states — each rank's status and figures, the group's peak and cap, and its consistency
findings (``findings.py``). Pure: states and a clock in, view out."""

from __future__ import annotations

from collections import Counter

from capwatch.backends import pricing_of, spec_of
from capwatch.service.findings import Finding, consistency_findings
from capwatch.service.sources.contract import RankState
from capwatch.service.vocabulary import RankStatus
from pydantic import BaseModel


class RankView(BaseModel):
    ep_rank: int
    role: str
    state: RankStatus
    host: str | None = None
    boot_id: str | None = None
    boots: int | None = None  # None: the source does not see boots (Prometheus)
    ep_size: int | None = None
    cap: int | None = None
    last_report_unix_s: float | None = None
    seconds_since_report: float | None = None
    last_peak_runtime_tokens: int | None = None
    utilization: float | None = None
    max_runtime_tokens: int | None = None
    max_utilization: float | None = None
    last_max_local_tokens: int | None = None  # the rank's own largest local batch (None: not reported)
    max_local_tokens: int | None = None
    overflow_events_total: int = 0
    overflow_events: dict[str, int] = {}
    forward_steps_total: int = 0
    workspace_bytes_per_rank: int | None = None  # as reported (allocated when the backend knows)
    expected_workspace_bytes_per_rank: int | None = None  # FlashInfer's formula for the rank's own cap
    final: bool = False


class ClusterView(BaseModel):
    cluster: str
    role: str
    roles: list[str]
    ep_size: int
    ranks_expected: int
    ranks_reporting: int
    ranks_stale: int
    ranks_missing: int
    cap: int
    caps: list[int]
    group_peak_runtime_tokens: int
    group_utilization: float
    group_max_runtime_tokens: int
    group_max_utilization: float
    hottest_rank: int | None
    overflow_events_total: int
    overflow_events: dict[str, int]
    workspace_bytes_per_rank: int | None
    workspace_bytes_group: int | None
    reported_workspace_bytes_group: int
    last_report_unix_s: float | None
    findings: list[Finding]
    ranks: list[RankView]


def rank_status(state: RankState, now_s: float, stale_after_s: float, missing_after_s: float) -> RankStatus:
    age = now_s - state.received_unix_s
    if age >= missing_after_s:
        return "missing"
    return "stale" if age >= stale_after_s else "reporting"


def role_order(states: list[RankState]) -> list[str]:
    """The roles of a cluster's ranks, the target dispatcher first."""
    return sorted({state.role for state in states}, key=lambda role: (role != "target", role))


def _rank_view(state: RankState, status: RankStatus, now_s: float) -> RankView:
    reported = state.config.allocated_workspace_bytes or state.config.workspace_bytes_per_rank
    expected = pricing_of(state.config, state.ep_size).known_bytes_per_rank(state.cap)
    return RankView(
        ep_rank=state.ep_rank, role=state.role, state=status, host=state.host, boot_id=state.boot_id,
        boots=state.boots, ep_size=state.ep_size, cap=state.cap, last_report_unix_s=state.received_unix_s,
        seconds_since_report=round(now_s - state.received_unix_s, 3),
        last_peak_runtime_tokens=state.last_peak_runtime_tokens,
        utilization=state.last_peak_runtime_tokens / state.cap, max_runtime_tokens=state.max_runtime_tokens,
        max_utilization=state.max_runtime_tokens / state.cap, last_max_local_tokens=state.last_max_local_tokens,
        max_local_tokens=state.max_local_tokens, overflow_events_total=state.overflow_events_total,
        overflow_events=dict(state.overflow_totals), forward_steps_total=state.forward_steps_total,
        workspace_bytes_per_rank=reported, expected_workspace_bytes_per_rank=expected, final=state.final)


def summarize_cluster(cluster: str, role: str, all_states: list[RankState], now_s: float,
                      stale_after_s: float, missing_after_s: float) -> ClusterView:
    roles = role_order(all_states)
    states = sorted((state for state in all_states if state.role == role), key=lambda s: s.ep_rank)
    if not states:
        raise KeyError(role)
    views = [_rank_view(state, rank_status(state, now_s, stale_after_s, missing_after_s), now_s) for state in states]
    live_pairs = [(state, view) for state, view in zip(states, views) if view.state != "missing"]
    live_states = [state for state, _ in live_pairs] or states
    ep_size = max(state.ep_size for state in states)
    seen = {state.ep_rank for state in states}
    views += [RankView(ep_rank=rank, role=role, state="missing") for rank in range(ep_size) if rank not in seen]
    findings = consistency_findings(states, views, ep_size)
    views.sort(key=lambda view: view.ep_rank)
    cap = max(state.cap for state in live_states)
    live_views = [view for _, view in live_pairs] or [v for v in views if v.cap is not None]
    hottest = max(live_views, key=lambda view: view.last_peak_runtime_tokens or 0)
    group_peak = hottest.last_peak_runtime_tokens or 0
    group_max = max(state.max_runtime_tokens for state in states)
    overflow: Counter = Counter()
    for state in states:
        overflow.update(state.overflow_totals)
    top = max(live_states, key=lambda state: state.cap)
    per_rank = pricing_of(top.config, ep_size).known_bytes_per_rank(cap)
    return ClusterView(
        cluster=cluster, role=role, roles=roles, ep_size=ep_size, ranks_expected=ep_size,
        ranks_reporting=sum(view.state == "reporting" for view in views),
        ranks_stale=sum(view.state == "stale" for view in views),
        ranks_missing=sum(view.state == "missing" for view in views),
        cap=cap, caps=sorted({state.cap for state in states}),
        group_peak_runtime_tokens=group_peak, group_utilization=group_peak / cap,
        group_max_runtime_tokens=group_max, group_max_utilization=group_max / cap,
        hottest_rank=hottest.ep_rank if group_peak else None,
        overflow_events_total=sum(overflow.values()), overflow_events=dict(overflow),
        workspace_bytes_per_rank=per_rank, workspace_bytes_group=per_rank * ep_size if per_rank else None,
        reported_workspace_bytes_group=sum(view.workspace_bytes_per_rank or 0 for view in views),
        last_report_unix_s=max(state.received_unix_s for state in states),
        findings=findings, ranks=views)
