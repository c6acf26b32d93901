"""Each EP group's digest (its view and advice), for the list view, ``/metrics`` and ``/advice``, recomputed
only when the group changed: the digest functions (``_compute``, ``_quick``) and ``GroupDigests``, the thin
coordinator of the change tracking (``cluster_changes.py``), the cache (``digest_cache.py``) and the background
refresher (``refresher.py``).

A group's digest depends only on its committed data (versioned per cluster by a source with a log of changes,
``ClusterSource.changes``) and on which of its ranks are reporting, stale or missing. ``/advice`` (``group``) is
never stale; the list (``every_group``) is kept as a ready answer and served as the refresher computed it when
many groups changed. Why compute on change, how stale each reader may be, and the budgets: docs/service.md,
"Group digests".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from capwatch.advisor.advice import Advice
from capwatch.service.cluster_changes import ChangeTracker
from capwatch.service.cluster_view import ClusterView, rank_status, role_order
from capwatch.service.config import Settings
from capwatch.service.digest_cache import DigestCache
from capwatch.service.queries import AdviceUnavailable, cluster_advice, cluster_view, role_states
from capwatch.service.refresher import Refresher
from capwatch.service.sources.contract import ClusterSource, RankState
from capwatch.vocabulary import ROLES

log = logging.getLogger(__name__)


class ClusterSummary(BaseModel):
    cluster: str
    roles: list[str]
    ep_size: int
    cap: int
    ranks_reporting: int
    ranks_stale: int
    ranks_missing: int
    group_peak_runtime_tokens: int
    group_utilization: float
    overflow_events_total: int
    workspace_bytes_group: int | None
    findings: list[str]
    critical: bool = False  # a finding of critical severity: the page lists such a group first
    action: str | None
    recommended_cap: int | None
    last_report_unix_s: float | None
    error: str | None = None  # why this group has no advice (its ranks cannot be priced or advised)
    pending: bool = False  # listed from its ranks' states alone: findings and advice not computed yet


@dataclass(frozen=True)
class GroupDigest:
    """One EP group (a cluster's ranks of one role): its view, and its advice or why there is none."""

    cluster: str
    role: str
    view: ClusterView | None  # as last computed (None: not computed yet)
    advice: Advice | None
    error: str | None
    summary_json: bytes  # the ClusterSummary, serialised once
    pending: bool = False  # the summary's states are current, its findings and advice as last computed (see _quick)


def _compute(source: ClusterSource, cluster: str, role: str, states: list[RankState], now_s: float,
             settings: Settings) -> GroupDigest:
    """LookupError when the cluster has no ranks of ``role``."""
    view = cluster_view(source, cluster, role, now_s, settings, states)
    advice, error = None, None
    try:
        advice = cluster_advice(source, cluster, role, now_s, settings, states)
    except AdviceUnavailable as unavailable:
        error = str(unavailable)
    summary = ClusterSummary(
        cluster=cluster, roles=view.roles, ep_size=view.ep_size, cap=view.cap,
        ranks_reporting=view.ranks_reporting, ranks_stale=view.ranks_stale, ranks_missing=view.ranks_missing,
        group_peak_runtime_tokens=view.group_peak_runtime_tokens, group_utilization=view.group_utilization,
        overflow_events_total=view.overflow_events_total, workspace_bytes_group=view.workspace_bytes_group,
        findings=[finding.kind for finding in view.findings], action=advice.action if advice else None,
        critical=any(finding.severity == "critical" for finding in view.findings),
        recommended_cap=advice.recommended_cap if advice else None, last_report_unix_s=view.last_report_unix_s,
        error=error)
    return GroupDigest(cluster, role, view, advice, error, summary.model_dump_json().encode())


def _quick(cluster: str, role: str, states: list[RankState], now_s: float, settings: Settings,
           last: GroupDigest | None) -> GroupDigest | None:
    """A changed group listed at once: what its ranks' states say (cap, ranks, peak, overflows: no pricing), with
    its findings and advice as ``last`` computed (none when never computed), ``pending`` until computed. What the
    refresher can afford for thousands of groups at a time. None when it has no ranks of ``role``."""
    chosen = [state for state in states if state.role == role]
    if not chosen:
        return None
    statuses = [rank_status(state, now_s, settings.stale_after_s, settings.missing_after_s) for state in chosen]
    live = [state for state, status in zip(chosen, statuses) if status != "missing"] or chosen
    ep_size, cap = max(state.ep_size for state in chosen), max(state.cap for state in live)
    peak = max(state.last_peak_runtime_tokens for state in live)
    view, advice = (last.view, last.advice) if last is not None else (None, None)
    summary = ClusterSummary(
        cluster=cluster, roles=role_order(states), ep_size=ep_size, cap=cap,
        ranks_reporting=statuses.count("reporting"), ranks_stale=statuses.count("stale"),
        ranks_missing=statuses.count("missing") + ep_size - len({state.ep_rank for state in chosen}),
        group_peak_runtime_tokens=peak, group_utilization=peak / cap,
        overflow_events_total=sum(state.overflow_events_total for state in chosen),
        workspace_bytes_group=view.workspace_bytes_group if view is not None else None,
        findings=[finding.kind for finding in view.findings] if view is not None else [],
        critical=view is not None and any(finding.severity == "critical" for finding in view.findings),
        action=advice.action if advice else None, recommended_cap=advice.recommended_cap if advice else None,
        last_report_unix_s=max(state.received_unix_s for state in chosen),
        error=last.error if last is not None else None, pending=True)
    return GroupDigest(cluster, role, view, advice, last.error if last is not None else None,
                       summary.model_dump_json().encode(), pending=True)


# A read recomputes changed groups for at most this long, stalest first; the rest are served as listed by the
# refresher. Bounds a read's cost when thousands of groups report all the time, not only when few change.
RECOMPUTE_BUDGET_S = 0.05
# The background refresher computes for this long, then leaves the readers this long (a third of its time); each
# pass first lists every group that changed since the last one (_quick), so a change shows within about a second.
REFRESH_SLICE_S = 0.2
REFRESH_PAUSE_S = 0.1
REFRESH_IDLE_S = 0.5  # how often it looks for changes when everything is current
# A read computes changed groups only when they are this few (a deployment that changes little, and tests that
# read what they just wrote); more than this, and the reads would only compete with the refresher for the CPU.
READ_RECOMPUTE_MAX_GROUPS = 32


class GroupDigests:
    """The digests of every group, reused while the group's data and rank states are unchanged: a thin coordinator
    of the change tracking (``cluster_changes.ChangeTracker``), the cache (``digest_cache.DigestCache``) and the
    background refresher (``refresher.Refresher``), under one lock.

    With a source that keeps a log of changes (the store: ``ClusterSource.changes``) the list is kept as a ready
    answer: a read or a refresher pass looks only at the clusters that changed since the last one or whose ranks
    are due to turn stale or missing, so its cost follows what changed, not how many clusters are held (a read over
    5,000 unchanged clusters read every one's generation: 40 ms)."""

    def __init__(self, source: ClusterSource, settings: Settings, clock: Callable[[], float],
                 recompute_budget_s: float = RECOMPUTE_BUDGET_S):
        self.source = source
        self.settings = settings
        self.clock = clock
        self.recompute_budget_s = recompute_budget_s
        self._lock = threading.RLock()
        self.cache = DigestCache(self._lock)
        # Without a log of changes (Prometheus), every read computes every group.
        self.changes = ChangeTracker(source, source.changes(), settings, self._lock, self.cache.answers_changed)
        self._list_json: tuple[list[GroupDigest], bytes] | None = None  # the list it was made of, the answer
        self.refresher = Refresher(self.refresh, what="the groups' digests", name="capwatch-digests",
                                   slice_s=REFRESH_SLICE_S, pause_s=REFRESH_PAUSE_S, idle_s=REFRESH_IDLE_S)

    @property
    def _versioned(self) -> bool:
        return self.changes.changes is not None

    def _keep(self, cluster: str, role: str, key: tuple | None, digest: GroupDigest, full: bool = True) -> None:
        if key is None:
            return
        with self._lock:
            self.cache.keep((cluster, role), key, digest, full)
            current = self.changes.reads.get(cluster)
            if current is None or current.key != key:
                self.changes.dirty.add(cluster)  # computed from an older read than the one kept: look again
            elif full:
                self.cache.unfinished.discard((cluster, role))

    def _computed(self, cluster: str, role: str, states: list[RankState], now_s: float,
                  key: tuple | None) -> GroupDigest:
        digest = _compute(self.source, cluster, role, states, now_s, self.settings)
        self._keep(cluster, role, key, digest)
        return digest

    def _computed_or_left_out(self, cluster: str, role: str, states: list[RankState], now_s: float,
                              key: tuple | None) -> GroupDigest | None:
        """The group's digest for ``role``; None when it has no such ranks. An error computing it is the
        group's own: logged, and the group left out of this answer."""
        try:
            return self._computed(cluster, role, states, now_s, key)
        except LookupError:
            return None  # no ranks of this role (any more)
        except Exception:  # a bug must not take the other groups down with it
            log.exception("cannot compute cluster %s, dispatcher %s", cluster, role)
            return None

    def group(self, cluster: str, role: str, now_s: float) -> GroupDigest:
        """One group's digest, current for its committed data (never served stale; see the module's docstring).
        ``UnknownCluster`` (a LookupError) when the cluster has no ranks of ``role``; any other error is raised."""
        read = self.changes.read(cluster, now_s)
        role_states(self.source, cluster, role, read.states)
        return (self.cache.current((cluster, role), read.key)
                or self._computed(cluster, role, read.states, now_s, read.key))

    # --- every group: kept as a ready answer, computed ahead -------------------------------------

    def _read_again(self, now_s: float) -> None:
        """Read every marked cluster: its groups whose key changed are unfinished; a pruned cluster's go."""
        for cluster in self.changes.take_dirty():
            try:
                read = self.changes.read(cluster, now_s)
            except Exception:
                log.exception("cannot read the ranks of cluster %s", cluster)
                continue
            with self._lock:
                for role in ROLES:
                    if role not in read.roles:
                        self.cache.forget((cluster, role))  # the cluster pruned, or this role's ranks
                for role in read.roles:
                    cached = self.cache.entries.get((cluster, role))
                    if cached is None or cached.key != read.key or not cached.full:
                        self.cache.unfinished.add((cluster, role))

    def _list_unfinished(self, now_s: float) -> None:
        """List at once every unfinished group not yet listed under its current key (``_quick``)."""
        with self._lock:
            unfinished = list(self.cache.unfinished)
        for cluster, role in unfinished:
            read, cached = self.changes.reads.get(cluster), self.cache.entries.get((cluster, role))
            if read is not None and (cached is None or cached.key != read.key):
                digest = _quick(cluster, role, read.states, now_s, self.settings,
                                cached.digest if cached is not None else None)
                if digest is not None:
                    self._keep(cluster, role, read.key, digest, full=False)

    def _compute_unfinished(self, now_s: float, budget_s: float, stoppable: bool = False) -> int:
        """Compute unfinished groups, never computed first then the stalest, for at most ``budget_s`` (and, for
        the refresher, until it is stopped); how many are still to compute."""
        with self._lock:
            todo = sorted(self.cache.unfinished, key=self.cache.staleness)
        deadline = time.perf_counter() + budget_s
        for done, (cluster, role) in enumerate(todo):
            if time.perf_counter() > deadline or (stoppable and self.refresher.stopping):
                return len(todo) - done
            read = self.changes.reads.get(cluster)
            if read is None or self._computed_or_left_out(cluster, role, read.states, now_s, read.key) is None:
                with self._lock:  # pruned meanwhile, or nothing to list (an error is logged, once)
                    self.cache.unfinished.discard((cluster, role))
        return 0

    def _answer(self, all_roles: bool) -> list[GroupDigest]:
        return self.cache.answer(all_roles, self.changes.order, lambda cluster: self.changes.reads[cluster].roles)

    def refresh(self, budget_s: float) -> int:
        """One pass of the refresher: list every changed group at once, then compute the changed groups for at
        most ``budget_s`` (the never computed first, then the stalest); how many are still to compute."""
        now = self.clock()
        self.changes.take_changes(now)
        self._read_again(now)
        self._list_unfinished(now)
        return self._compute_unfinished(now, budget_s, stoppable=True)

    def warm(self) -> None:
        """Compute every group's digests (at start, so the first read finds them)."""
        try:
            now = self.clock()
            self.changes.take_changes(now)
            self._read_again(now)
            self._compute_unfinished(now, float("inf"))  # every group, none listed quickly first: all computed now
            self._answer(all_roles=False)  # and the list itself, ready for the first read
        except Exception:
            log.exception("cannot compute the groups' digests at start; reads and the refresher will")

    def start_refresher(self) -> None:
        """Keep every group's digest current in the background (a source without a log of changes, Prometheus,
        is read per request instead: nothing to refresh)."""
        if self._versioned:
            self.refresher.start()

    def stop_refresher(self) -> None:
        self.refresher.stop()

    def every_group(self, all_roles: bool) -> list[GroupDigest]:
        """One digest per group (its first role, target first), or per group and role: as kept, the changed ones
        recomputed first within the read's budget, stalest first, when they are few or no refresher runs (see
        the module's docstring)."""
        if not self._versioned:
            return self._every_group_computed(all_roles)
        now = self.clock()
        self.changes.take_changes(now)
        if (not self.refresher.running
                or len(self.changes.dirty) + len(self.cache.unfinished) <= READ_RECOMPUTE_MAX_GROUPS):
            self._read_again(now)
            self._compute_unfinished(now, self.recompute_budget_s)
        return self._answer(all_roles)

    def list_json(self) -> bytes:
        """The list's answer, ``every_group(all_roles=False)``'s summaries as one JSON array: the same bytes for every
        client while the list is unchanged (with a log of changes; without, made per read)."""
        digests = self.every_group(all_roles=False)
        made = self._list_json
        if made is None or made[0] is not digests:
            made = self._list_json = (digests, b"[" + b",".join(digest.summary_json for digest in digests) + b"]")
        return made[1]

    def _every_group_computed(self, all_roles: bool) -> list[GroupDigest]:
        """A source without a log of changes (Prometheus, which caches its own queries): every group computed in
        the read, for at most its budget (the rest left out of this answer)."""
        now = self.clock()
        deadline = time.perf_counter() + self.recompute_budget_s
        digests = []
        for cluster in self.source.clusters():
            try:
                read = self.changes.read(cluster, now)
            except Exception:
                log.exception("cannot read the ranks of cluster %s", cluster)
                continue
            for role in read.roles if all_roles else read.roles[:1]:
                if time.perf_counter() <= deadline:
                    digest = self._computed_or_left_out(cluster, role, read.states, now, None)
                    if digest is not None:
                        digests.append(digest)
        return digests
