"""Each EP group's digest (its view and advice), for the list view, ``/metrics`` and ``/advice``, recomputed
only when the group changed.

``GET /v1/clusters`` and ``/metrics`` cover every cluster. Recomputing every view and advice on
each call made both grow with clusters nobody asked about (3,000 clusters: 1.7 s and 2.1 s, and the
page polls every 3 s per tab). The choice here is *compute on change*: a group's digest depends only
on its committed data — which the store versions per cluster (``generation``, bumped by every commit,
fold and prune that touches it) — and on which of its ranks are reporting, stale or missing, the
only way the clock enters a digest. Both are cheap to read, so a call recomputes the groups that
changed and reuses the rest, serialised once. A cache per window would still recompute every
group once per window; paging would change the API the page and ``capwatch advise`` read. A source
without generations (Prometheus, which caches its own queries) is computed on every call.

The generation is read before the rank states and the history: a commit landing while a digest is computed
leaves it cached under the older generation, so the next read recomputes it (read after, the digest would be
kept as current with the states from before the commit).

How stale each reader may be:

- ``GET /v1/clusters`` and ``/metrics`` (``every_group``): a group whose data or rank statuses changed is
  recomputed within the read's budget (``RECOMPUTE_BUDGET_S``, stalest first); past it, the group is served
  as last computed — the advice of an older generation, seconds old — until a later read catches it up.
- ``GET /v1/clusters/{cluster}/advice`` (``group``): never stale. A digest is reused only under the same
  generation and rank statuses, where a fresh computation gives the same advice (it reads nothing else; the
  clock only through the statuses); a changed group is recomputed in the request, whatever the budget, and
  that catches the list up too.

A group whose advice cannot be computed gets a digest with its error: that group shows it, every
other group and the list keep working.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from capwatch.service.advisor.advice import Advice
from capwatch.service.cluster_view import ClusterView, rank_status, role_order
from capwatch.service.config import Settings
from capwatch.service.queries import AdviceUnavailable, cluster_advice, cluster_view, role_states
from capwatch.service.sources.contract import ClusterSource, RankState

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
    action: str | None
    recommended_cap: int | None
    last_report_unix_s: float | None
    error: str | None = None  # why this group has no advice (its ranks cannot be priced or advised)


@dataclass(frozen=True)
class GroupDigest:
    """One EP group (a cluster's ranks of one role): its view, and its advice or why there is none."""

    cluster: str
    role: str
    view: ClusterView
    advice: Advice | None
    error: str | None
    summary_json: bytes  # the ClusterSummary, serialised once


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
        recommended_cap=advice.recommended_cap if advice else None, last_report_unix_s=view.last_report_unix_s,
        error=error)
    return GroupDigest(cluster, role, view, advice, error, summary.model_dump_json().encode())


# A read recomputes changed groups for at most this long, stalest first; the rest are served as last
# computed (seconds old) and caught up by the next reads. Bounds a read's cost when thousands of groups
# report all the time, not only when few change.
RECOMPUTE_BUDGET_S = 0.05


@dataclass
class _Cached:
    key: tuple
    digest: GroupDigest
    computed: float  # time.perf_counter() when computed


class GroupDigests:
    """The digests of every group, reused while the group's data and rank states are unchanged."""

    def __init__(self, source: ClusterSource, settings: Settings, clock: Callable[[], float],
                 recompute_budget_s: float = RECOMPUTE_BUDGET_S):
        self.source = source
        self.settings = settings
        self.clock = clock
        self.recompute_budget_s = recompute_budget_s
        self._generation = getattr(source, "generation", None)
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._lock = threading.Lock()

    def _read(self, cluster: str, now_s: float) -> tuple[tuple | None, list[RankState]]:
        """The cluster's cache key and rank states: the generation first (see the module's docstring)."""
        generation = None if self._generation is None else self._generation(cluster)
        states = self.source.rank_states(cluster)
        if generation is None:
            return None, states
        settings = self.settings
        return (generation, tuple(rank_status(state, now_s, settings.stale_after_s, settings.missing_after_s)
                                  for state in states)), states

    def _cached(self, cluster: str, role: str, key: tuple | None) -> GroupDigest | None:
        cached = self._cache.get((cluster, role))
        return cached.digest if key is not None and cached is not None and cached.key == key else None

    def _computed(self, cluster: str, role: str, states: list[RankState], now_s: float,
                  key: tuple | None) -> GroupDigest:
        digest = _compute(self.source, cluster, role, states, now_s, self.settings)
        if key is not None:
            with self._lock:
                self._cache[(cluster, role)] = _Cached(key, digest, time.perf_counter())
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
        key, states = self._read(cluster, now_s)
        role_states(self.source, cluster, role, states)
        return self._cached(cluster, role, key) or self._computed(cluster, role, states, now_s, key)

    def warm(self) -> None:
        """Compute every group's digests (at start, so the first read finds them)."""
        try:
            self.every_group(all_roles=True)
        except Exception:
            log.exception("cannot compute the groups' digests at start; reads will")

    def every_group(self, all_roles: bool) -> list[GroupDigest]:
        """One digest per group (its first role, target first), or per group and role."""
        now = self.clock()
        started = time.perf_counter()
        entries = []  # (cluster, role, states, key, cached)
        clusters = self.source.clusters()
        for cluster in clusters:
            try:
                key, states = self._read(cluster, now)
            except Exception:
                log.exception("cannot read the ranks of cluster %s", cluster)
                continue
            roles = role_order(states)
            for role in roles if all_roles else roles[:1]:
                entries.append((cluster, role, states, key, self._cache.get((cluster, role))))
        digests: dict[tuple[str, str], GroupDigest | None] = {
            (cluster, role): cached.digest for cluster, role, _, key, cached in entries
            if key is not None and cached is not None and cached.key == key}
        changed = [entry for entry in entries if (entry[0], entry[1]) not in digests]
        changed.sort(key=lambda entry: entry[4].computed if entry[4] is not None else -1.0)  # stalest first
        deadline = started + self.recompute_budget_s
        for cluster, role, states, key, cached in changed:
            if cached is not None and time.perf_counter() > deadline:
                digests[(cluster, role)] = cached.digest  # as last computed; a later read catches up
            else:
                digests[(cluster, role)] = self._computed_or_left_out(cluster, role, states, now, key)
        if len(self._cache) > 2 * len(entries) + 16:  # forget groups that were pruned
            known = set(clusters)
            with self._lock:
                self._cache = {key: value for key, value in self._cache.items() if key[0] in known}
        return [digest for digest in (digests[(entry[0], entry[1])] for entry in entries) if digest is not None]
