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

- ``GET /v1/clusters`` and ``/metrics`` (``every_group``): the list is kept as a ready answer, and only the
  clusters that changed are looked at again: those the store's log of changes names (``changed_since``: every
  commit, fold and prune) and those with a rank due to turn stale or missing by now (``_expiries``, the clock's
  only way in). A read over thousands of unchanged clusters costs no more than serving the kept answer. What the
  list needs is computed ahead, in the background (``start_refresher``: each pass, every changed group listed at
  once from its ranks' states — ``pending``, its findings and advice as last computed, none yet for a new group —
  then the changed groups computed, those never computed first, then the stalest, in slices that leave the
  readers most of the time), and at start before the first read. A read recomputes changed groups itself only
  when they are few (``READ_RECOMPUTE_MAX_GROUPS``: a deployment that changes little reads what it just wrote) and
  within its budget (``RECOMPUTE_BUDGET_S``, stalest first); otherwise a group is served as the refresher listed
  it, and one that arrived since its last pass (under a second ago) is left out of that read. Reads stay fast
  after thousands of new clusters, a restart or under a steady write load, and a change shows within a second.
- ``GET /v1/clusters/{cluster}/advice`` (``group``): never stale. A digest is reused only under the same
  generation and rank statuses, where a fresh computation gives the same advice (it reads nothing else; the
  clock only through the statuses); a changed group is recomputed in the request, whatever the budget, and
  that catches the list up too.

A group whose advice cannot be computed gets a digest with its error: that group shows it, every
other group and the list keep working.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from capwatch.advisor.advice import Advice
from capwatch.service.cluster_view import ClusterView, rank_status, role_order
from capwatch.service.config import Settings
from capwatch.service.queries import AdviceUnavailable, cluster_advice, cluster_view, role_states
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


@dataclass
class _Cached:
    key: tuple
    digest: GroupDigest
    computed: float  # time.perf_counter() when computed
    full: bool = True  # False: listed by _quick, to be computed


@dataclass(frozen=True)
class _ClusterRead:
    """A cluster's cache key and rank states, reused while its generation holds and no rank's status can have
    changed (``valid_until``: the first moment one of them turns stale or missing): reading every rank of
    thousands of clusters on each read was most of a read's cost."""

    generation: int | None
    key: tuple | None
    states: list[RankState]
    roles: list[str]
    read_at: float
    valid_until: float


class GroupDigests:
    """The digests of every group, reused while the group's data and rank states are unchanged.

    With a source that versions its clusters (the store: ``generation`` and ``changed_since``) the list is kept
    as a ready answer: a read or a refresher pass looks only at the clusters that changed since the last one
    (the store's log of changes) or whose ranks are due to turn stale or missing (``_expiries``), so its cost
    follows what changed, not how many clusters are held (a read over 5,000 unchanged clusters read every one's
    generation: 40 ms)."""

    def __init__(self, source: ClusterSource, settings: Settings, clock: Callable[[], float],
                 recompute_budget_s: float = RECOMPUTE_BUDGET_S):
        self.source = source
        self.settings = settings
        self.clock = clock
        self.recompute_budget_s = recompute_budget_s
        self._generation = getattr(source, "generation", None)
        self._changes = getattr(source, "changed_since", None)
        if self._changes is None:
            self._generation = None  # without the log of changes, every read computes every group
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._reads: dict[str, _ClusterRead] = {}  # clusters with ranks, as last read
        self._mark: int | None = None  # how far the store's log of changes was taken (None: not yet)
        self._last_now = float("-inf")
        self._dirty: set[str] = set()  # clusters to read again: changed, or a rank's status due to change
        self._expiries: list[tuple[float, str]] = []  # heap: when a cluster's rank statuses change next
        self._unfinished: set[tuple[str, str]] = set()  # groups without a full digest for their current key
        self._answers: dict[bool, list[GroupDigest]] = {}  # the list, per all_roles, until anything changes
        self._order: list[str] | None = None  # sorted(self._reads), until a cluster comes or goes
        self._lock = threading.RLock()
        self._refresher: threading.Thread | None = None
        self._stop = threading.Event()

    def _read(self, cluster: str, now_s: float) -> _ClusterRead:
        """The cluster's cache key and rank states: the generation first (see the module's docstring)."""
        generation = None if self._generation is None else self._generation(cluster)
        known = self._reads.get(cluster)
        if (known is not None and generation is not None and known.generation == generation
                and known.read_at <= now_s < known.valid_until):
            return known
        states = self.source.rank_states(cluster)
        roles = role_order(states)
        if generation is None:
            return _ClusterRead(None, None, states, roles, now_s, now_s)
        settings, statuses, valid_until = self.settings, [], float("inf")
        for state in states:
            status = rank_status(state, now_s, settings.stale_after_s, settings.missing_after_s)
            statuses.append(status)
            if status != "missing":  # when it turns stale, or missing
                threshold = settings.stale_after_s if status == "reporting" else settings.missing_after_s
                valid_until = min(valid_until, state.received_unix_s + threshold)
        read = _ClusterRead(generation, (generation, tuple(statuses)), states, roles, now_s, valid_until)
        with self._lock:
            if states:
                if cluster not in self._reads:
                    self._order = None
                self._reads[cluster] = read
                if valid_until != float("inf"):
                    heapq.heappush(self._expiries, (valid_until, cluster))
            elif self._reads.pop(cluster, None) is not None:  # pruned: kept no longer (nor an unknown name)
                self._order = None
            self._answers.clear()
        return read

    def _cached(self, cluster: str, role: str, key: tuple | None) -> GroupDigest | None:
        cached = self._cache.get((cluster, role))
        if key is None or cached is None or cached.key != key or not cached.full:
            return None
        return cached.digest

    def _keep(self, cluster: str, role: str, key: tuple | None, digest: GroupDigest, full: bool = True) -> None:
        if key is None:
            return
        with self._lock:
            self._cache[(cluster, role)] = _Cached(key, digest, time.perf_counter(), full)
            self._answers.clear()
            current = self._reads.get(cluster)
            if current is None or current.key != key:
                self._dirty.add(cluster)  # computed from an older read than the one kept: look again
            elif full:
                self._unfinished.discard((cluster, role))

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
        read = self._read(cluster, now_s)
        role_states(self.source, cluster, role, read.states)
        return self._cached(cluster, role, read.key) or self._computed(cluster, role, read.states, now_s, read.key)

    # --- every group: kept as a ready answer, computed ahead -------------------------------------

    def _take_changes(self, now_s: float) -> None:
        """Mark for reading again every cluster changed since the last look, and every one with a rank whose
        status has changed since (stale, missing) by ``now_s``."""
        with self._lock:
            self._mark, changed = self._changes(self._mark or 0)
            self._dirty.update(changed)
            if now_s < self._last_now:  # the clock went back: every status may be another
                self._dirty.update(self._reads)
            self._last_now = now_s
            while self._expiries and self._expiries[0][0] <= now_s:
                self._dirty.add(heapq.heappop(self._expiries)[1])

    def _read_again(self, now_s: float) -> None:
        """Read every marked cluster: its groups whose key changed are unfinished; a pruned cluster's go."""
        with self._lock:
            clusters, self._dirty = self._dirty, set()
        for cluster in clusters:
            try:
                read = self._read(cluster, now_s)
            except Exception:
                log.exception("cannot read the ranks of cluster %s", cluster)
                continue
            with self._lock:
                for gone in [(cluster, role) for role in ROLES if role not in read.roles]:
                    self._cache.pop(gone, None)  # the cluster pruned, or this role's ranks
                    self._unfinished.discard(gone)
                for role in read.roles:
                    cached = self._cache.get((cluster, role))
                    if cached is None or cached.key != read.key or not cached.full:
                        self._unfinished.add((cluster, role))

    def _list_unfinished(self, now_s: float) -> None:
        """List at once every unfinished group not yet listed under its current key (``_quick``)."""
        with self._lock:
            unfinished = list(self._unfinished)
        for cluster, role in unfinished:
            read, cached = self._reads.get(cluster), self._cache.get((cluster, role))
            if read is not None and (cached is None or cached.key != read.key):
                digest = _quick(cluster, role, read.states, now_s, self.settings,
                                cached.digest if cached is not None else None)
                if digest is not None:
                    self._keep(cluster, role, read.key, digest, full=False)

    def _staleness(self, group: tuple[str, str]) -> tuple:
        """Never computed first, then the stalest."""
        cached = self._cache.get(group)
        return (cached is not None and cached.digest.view is not None, cached.computed if cached else 0.0)

    def _compute_unfinished(self, now_s: float, budget_s: float, stoppable: bool = False) -> int:
        """Compute unfinished groups, never computed first then the stalest, for at most ``budget_s`` (and, for
        the refresher, until it is stopped); how many are still to compute."""
        with self._lock:
            todo = sorted(self._unfinished, key=self._staleness)
        deadline = time.perf_counter() + budget_s
        for done, (cluster, role) in enumerate(todo):
            if time.perf_counter() > deadline or (stoppable and self._stop.is_set()):
                return len(todo) - done
            read = self._reads.get(cluster)
            if read is None or self._computed_or_left_out(cluster, role, read.states, now_s, read.key) is None:
                with self._lock:  # pruned meanwhile, or nothing to list (an error is logged, once)
                    self._unfinished.discard((cluster, role))
        return 0

    def _answer(self, all_roles: bool) -> list[GroupDigest]:
        """The list as kept: each cluster's groups (or its first, target first) in the clusters' order."""
        with self._lock:
            answer = self._answers.get(all_roles)
            if answer is None:
                if self._order is None:
                    self._order = sorted(self._reads)
                answer = []
                for cluster in self._order:
                    roles = self._reads[cluster].roles
                    for role in roles if all_roles else roles[:1]:
                        cached = self._cache.get((cluster, role))
                        if cached is not None:  # a group newer than the refresher's last pass: not yet
                            answer.append(cached.digest)
                self._answers[all_roles] = answer
            return answer

    def refresh(self, budget_s: float) -> int:
        """One pass of the refresher: list every changed group at once, then compute the changed groups for at
        most ``budget_s`` (the never computed first, then the stalest); how many are still to compute."""
        now = self.clock()
        self._take_changes(now)
        self._read_again(now)
        self._list_unfinished(now)
        return self._compute_unfinished(now, budget_s, stoppable=True)

    def warm(self) -> None:
        """Compute every group's digests (at start, so the first read finds them)."""
        try:
            now = self.clock()
            self._take_changes(now)
            self._read_again(now)
            self._compute_unfinished(now, float("inf"))  # every group, none listed quickly first: all computed now
            self._answer(all_roles=False)  # and the list itself, ready for the first read
        except Exception:
            log.exception("cannot compute the groups' digests at start; reads and the refresher will")

    def start_refresher(self) -> None:
        """Keep every group's digest current in the background (a source without generations, Prometheus, is
        read per request instead: nothing to refresh)."""
        if self._refresher is not None or self._generation is None:
            return
        self._stop.clear()
        self._refresher = threading.Thread(target=self._refresh_forever, name="capwatch-digests", daemon=True)
        self._refresher.start()

    def stop_refresher(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(timeout=10)
            self._refresher = None

    def _refresh_forever(self) -> None:
        pause = REFRESH_IDLE_S
        while not self._stop.wait(pause):
            try:
                remaining = self.refresh(REFRESH_SLICE_S)
            except Exception:  # the source briefly unreadable: the next pass retries
                log.exception("cannot refresh the groups' digests; retrying")
                remaining = 0
            pause = REFRESH_PAUSE_S if remaining else REFRESH_IDLE_S

    def every_group(self, all_roles: bool) -> list[GroupDigest]:
        """One digest per group (its first role, target first), or per group and role: as kept, the changed ones
        recomputed first within the read's budget, stalest first, when they are few or no refresher runs (see
        the module's docstring)."""
        if self._generation is None:
            return self._every_group_computed(all_roles)
        now = self.clock()
        self._take_changes(now)
        if self._refresher is None or len(self._dirty) + len(self._unfinished) <= READ_RECOMPUTE_MAX_GROUPS:
            self._read_again(now)
            self._compute_unfinished(now, self.recompute_budget_s)
        return self._answer(all_roles)

    def _every_group_computed(self, all_roles: bool) -> list[GroupDigest]:
        """A source without generations (Prometheus, which caches its own queries): every group computed in the
        read, for at most its budget (the rest left out of this answer)."""
        now = self.clock()
        deadline = time.perf_counter() + self.recompute_budget_s
        digests = []
        for cluster in self.source.clusters():
            try:
                read = self._read(cluster, now)
            except Exception:
                log.exception("cannot read the ranks of cluster %s", cluster)
                continue
            for role in read.roles if all_roles else read.roles[:1]:
                if time.perf_counter() <= deadline:
                    digest = self._computed_or_left_out(cluster, role, read.states, now, None)
                    if digest is not None:
                        digests.append(digest)
        return digests
