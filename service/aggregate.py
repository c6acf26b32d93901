"""One view of an EP group from its ranks' latest states (pure: states and a clock in, view out).

Consistency findings are the failure modes operators hit: ranks that disagree on the cap or
ep_size (hangs, illegal memory access — sglang #30242, DeepEP #208), a workspace sized for
cap x ep_size (the double count of sglang PR #25907), and ranks that stopped reporting.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from capwatch.service.advisor.budget import WorkspacePricing
from capwatch.service.sources.contract import RankState
from capwatch.service.vocabulary import RankStatus
from capwatch.sizing.byte_units import format_gib
from capwatch.sizing.checks import SizingError
from pydantic import BaseModel

Severity = Literal["critical", "warning", "info"]
FINDING_KINDS = ("cap_mismatch", "ep_size_mismatch", "double_counted_workspace", "missing_rank", "stale_rank",
                 "workspace_mismatch")
# Reported bytes within this share of the cap x ep_size size count as the double count.
DOUBLE_COUNT_TOLERANCE = 0.02


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


class Finding(BaseModel):
    kind: str
    severity: Severity
    message: str
    ranks: list[int]


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


def pricing_of(state: RankState, ep_size: int | None = None) -> WorkspacePricing:
    return WorkspacePricing.of_config(state.config, ep_size or state.ep_size)


def _bytes_or_none(pricing: WorkspacePricing, cap: int) -> int | None:
    try:
        return pricing.bytes_per_rank(cap)
    except SizingError:  # e.g. an unknown flashinfer version: say nothing rather than guess
        return None


def _rank_view(state: RankState, status: RankStatus, now_s: float) -> RankView:
    reported = state.config.allocated_workspace_bytes or state.config.workspace_bytes_per_rank
    return RankView(
        ep_rank=state.ep_rank, role=state.role, state=status, host=state.host, boot_id=state.boot_id,
        boots=state.boots, ep_size=state.ep_size, cap=state.cap, last_report_unix_s=state.received_unix_s,
        seconds_since_report=round(now_s - state.received_unix_s, 3),
        last_peak_runtime_tokens=state.last_peak_runtime_tokens,
        utilization=state.last_peak_runtime_tokens / state.cap, max_runtime_tokens=state.max_runtime_tokens,
        max_utilization=state.max_runtime_tokens / state.cap, last_max_local_tokens=state.last_max_local_tokens,
        max_local_tokens=state.max_local_tokens, overflow_events_total=state.overflow_events_total,
        overflow_events=dict(state.overflow_totals), forward_steps_total=state.forward_steps_total,
        workspace_bytes_per_rank=reported, expected_workspace_bytes_per_rank=_bytes_or_none(pricing_of(state), state.cap),
        final=state.final)


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(rank) for rank in ranks)


def _disagreement(states: list[RankState], setting: str) -> tuple[Counter, int, list[int]]:
    """How many ranks run each value of ``setting``, the majority value, and the ranks that differ from it."""
    counts = Counter(getattr(state, setting) for state in states)
    majority = counts.most_common(1)[0][0] if counts else None
    odd = sorted(state.ep_rank for state in states if getattr(state, setting) != majority)
    return counts, majority, odd


def consistency_findings(states: list[RankState], views: list[RankView], ep_size: int) -> list[Finding]:
    """``views``: one per expected rank, the states' ranks first (in ``states`` order), then never-seen ranks."""
    findings: list[Finding] = []
    live = [state for state, view in zip(states, views) if view.state != "missing"] or states
    caps, majority, odd = _disagreement(live, "cap")
    if odd:
        findings.append(Finding(
            kind="cap_mismatch", severity="critical", ranks=odd,
            message=(f"ranks disagree on the cap: {dict(sorted(caps.items()))} (cap: ranks); every rank must run the "
                     f"same {majority}-token cap or dispatches can hang or read out of bounds — "
                     f"restart rank(s) {_ranks_text(odd)} with the group's value")))
    sizes, majority, odd = _disagreement(live, "ep_size")
    if odd:
        findings.append(Finding(
            kind="ep_size_mismatch", severity="critical", ranks=odd,
            message=(f"ranks disagree on ep_size: {dict(sorted(sizes.items()))} (ep_size: ranks); rank(s) "
                     f"{_ranks_text(odd)} belong to another group or were launched with a different configuration")))
    doubled, mismatched = [], []
    for state, view in zip(states, views):
        reported, expected = view.workspace_bytes_per_rank, view.expected_workspace_bytes_per_rank
        if expected is None or reported is None or reported == expected:
            continue
        sized_for_group = _bytes_or_none(pricing_of(state), state.cap * state.ep_size) if state.ep_size > 1 else None
        if sized_for_group and abs(reported - sized_for_group) <= DOUBLE_COUNT_TOLERANCE * sized_for_group:
            doubled.append((state, reported, expected))
        elif abs(reported - expected) > DOUBLE_COUNT_TOLERANCE * expected:
            mismatched.append((state, reported, expected))
    if doubled:
        state, reported, expected = doubled[0]
        findings.append(Finding(
            kind="double_counted_workspace", severity="warning", ranks=sorted(s.ep_rank for s, _, _ in doubled),
            message=(f"rank {state.ep_rank} holds {format_gib(reported)} of A2A workspace, the size for "
                     f"cap x ep_size = {state.cap * state.ep_size} tokens per rank; its cap of {state.cap} needs only "
                     f"{format_gib(expected)} — the per-rank cap was multiplied by ep_size twice "
                     f"(as in sglang PR #25907); size the workspace with the per-rank cap")))
    if mismatched:
        state, reported, expected = mismatched[0]
        findings.append(Finding(
            kind="workspace_mismatch", severity="info", ranks=sorted(s.ep_rank for s, _, _ in mismatched),
            message=(f"rank {state.ep_rank} reports {reported} workspace bytes; FlashInfer's formula gives "
                     f"{expected} for its configuration (check flashinfer_version and the payload sizes)")))
    missing = sorted(view.ep_rank for view in views if view.state == "missing")
    if missing:
        findings.append(Finding(
            kind="missing_rank", severity="critical", ranks=missing,
            message=(f"{len(missing)} of {ep_size} ranks are missing (never reported, or silent too long): "
                     f"{_ranks_text(missing)}; the view and advice only cover the others")))
    stale = sorted(view.ep_rank for view in views if view.state == "stale")
    if stale:
        findings.append(Finding(
            kind="stale_rank", severity="warning", ranks=stale,
            message=f"rank(s) {_ranks_text(stale)} have not reported recently; their numbers may be out of date"))
    return findings


def summarize_cluster(cluster: str, role: str, all_states: list[RankState], now_s: float,
                      stale_after_s: float, missing_after_s: float) -> ClusterView:
    roles = sorted({state.role for state in all_states}, key=lambda r: (r != "target", r))
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
    per_rank = _bytes_or_none(pricing_of(top, ep_size), cap)
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
