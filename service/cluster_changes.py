"""Which clusters changed since the digests last looked, and each one's rank states as last read: the change
tracking of ``GroupDigests`` (``digests.py``).

A cluster is looked at again when the source's log of changes names it (``ClusterChanges.changed_since``: every
commit, fold and prune) or when one of its ranks is due to turn stale or missing (an expiry heap: the clock's only
way into a digest). A read is reused while the cluster's generation holds and no rank's status can have changed.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable
from dataclasses import dataclass

from capwatch.service.cluster_view import rank_status, role_order
from capwatch.service.config import Settings
from capwatch.service.sources.contract import ClusterChanges, ClusterSource, RankState


@dataclass(frozen=True)
class ClusterRead:
    """A cluster's cache key and rank states, reused while its generation holds and no rank's status can have
    changed (``valid_until``: the first moment one of them turns stale or missing): reading every rank of
    thousands of clusters on each read was most of a read's cost."""

    generation: int | None
    key: tuple | None  # (generation, the ranks' statuses); None: a source without generations, never reused
    states: list[RankState]
    roles: list[str]
    read_at: float
    valid_until: float


class ChangeTracker:
    """The clusters with ranks as last read (``reads``), and those to read again (``dirty``). ``changes`` is the
    source's log of changes (None: a source without one; every read then reads anew). ``on_change`` is called, under
    ``lock``, whenever what is kept changes (the list kept as an answer is then out of date)."""

    def __init__(self, source: ClusterSource, changes: ClusterChanges | None, settings: Settings,
                 lock: threading.RLock, on_change: Callable[[], None]):
        self.source = source
        self.changes = changes
        self.settings = settings
        self.lock = lock
        self.on_change = on_change
        self.reads: dict[str, ClusterRead] = {}  # clusters with ranks, as last read
        self.dirty: set[str] = set()  # clusters to read again: changed, or a rank's status due to change
        self._mark: int | None = None  # how far the log of changes was taken (None: not yet)
        self._last_now = float("-inf")
        self._expiries: list[tuple[float, str]] = []  # heap: when a cluster's rank statuses change next
        self._order: list[str] | None = None  # sorted(self.reads), until a cluster comes or goes

    def read(self, cluster: str, now_s: float) -> ClusterRead:
        """The cluster's cache key and rank states: the generation first (see ``digests.py``)."""
        generation = None if self.changes is None else self.changes.generation(cluster)
        known = self.reads.get(cluster)
        if (known is not None and generation is not None and known.generation == generation
                and known.read_at <= now_s < known.valid_until):
            return known
        states = self.source.rank_states(cluster)
        roles = role_order(states)
        if generation is None:
            return ClusterRead(None, None, states, roles, now_s, now_s)
        settings, statuses, valid_until = self.settings, [], float("inf")
        for state in states:
            status = rank_status(state, now_s, settings.stale_after_s, settings.missing_after_s)
            statuses.append(status)
            if status != "missing":  # when it turns stale, or missing
                threshold = settings.stale_after_s if status == "reporting" else settings.missing_after_s
                valid_until = min(valid_until, state.received_unix_s + threshold)
        read = ClusterRead(generation, (generation, tuple(statuses)), states, roles, now_s, valid_until)
        with self.lock:
            if states:
                if cluster not in self.reads:
                    self._order = None
                self.reads[cluster] = read
                if valid_until != float("inf"):
                    heapq.heappush(self._expiries, (valid_until, cluster))
            elif self.reads.pop(cluster, None) is not None:  # pruned: kept no longer (nor an unknown name)
                self._order = None
            self.on_change()
        return read

    def take_changes(self, now_s: float) -> None:
        """Mark for reading again every cluster changed since the last look, and every one with a rank whose
        status has changed since (stale, missing) by ``now_s``."""
        with self.lock:
            self._mark, changed = self.changes.changed_since(self._mark or 0)
            self.dirty.update(changed)
            if now_s < self._last_now:  # the clock went back: every status may be another
                self.dirty.update(self.reads)
            self._last_now = now_s
            while self._expiries and self._expiries[0][0] <= now_s:
                self.dirty.add(heapq.heappop(self._expiries)[1])

    def take_dirty(self) -> set[str]:
        """The clusters marked for reading again; none is marked after."""
        with self.lock:
            clusters, self.dirty = self.dirty, set()
        return clusters

    def order(self) -> list[str]:
        """The clusters with ranks, sorted (kept until one comes or goes). Call under ``lock``."""
        if self._order is None:
            self._order = sorted(self.reads)
        return self._order
