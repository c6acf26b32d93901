"""The committed rank states, in memory, for readers: published only after their COMMIT and never mutated
once published (the writer changes copies). Each cluster has a generation, bumped whenever its committed
data changes (reports, folds, pruning): what a reader may cache the cluster's derived views under; and the
changes are counted in order, so a reader that keeps derived views of thousands of clusters asks which changed
since it last looked (``changed_since``) instead of reading every cluster's generation."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from capwatch.service.store.rank_state import ReportedRank

RankKey = tuple[str, str, int]  # cluster, role, ep_rank


class RankCache:
    def __init__(self, ranks: dict[RankKey, ReportedRank]):
        self._lock = threading.Lock()
        self._ranks: dict[RankKey, ReportedRank] = {}
        self._by_cluster: dict[str, dict[RankKey, ReportedRank]] = {}
        self._generations: dict[str, int] = {}
        self._changes = 0  # every cluster change, counted: a reader's place in them
        self._changed_at: dict[str, int] = {}  # cluster -> the count at its last change; oldest first
        self.publish(ranks)

    def publish(self, ranks: dict[RankKey, ReportedRank]) -> None:
        """Make committed states visible to readers, and mark their clusters changed."""
        with self._lock:
            for key, state in ranks.items():
                self._ranks[key] = state
                self._by_cluster.setdefault(key[0], {})[key] = state
            self._bump({key[0] for key in ranks})

    def forget(self, keys: Iterable[RankKey]) -> None:
        with self._lock:
            for key in keys:
                self._ranks.pop(key, None)
                members = self._by_cluster.get(key[0])
                if members is not None:
                    members.pop(key, None)
                    if not members:
                        del self._by_cluster[key[0]]
                self._bump((key[0],))

    def changed(self, clusters: Iterable[str]) -> None:
        """Mark clusters whose committed data changed other than by their ranks (a fold)."""
        with self._lock:
            self._bump(clusters)

    def _bump(self, clusters: Iterable[str]) -> None:
        for cluster in clusters:
            self._generations[cluster] = self._generations.get(cluster, 0) + 1
            self._changes += 1
            self._changed_at.pop(cluster, None)  # re-inserted last: the dict stays in order of change
            self._changed_at[cluster] = self._changes

    def changed_since(self, mark: int) -> tuple[int, list[str]]:
        """The clusters changed after ``mark`` (a count this returned before; 0: every cluster ever held, pruned
        ones too), and the mark to ask with next time. Costs what changed, not what is held."""
        with self._lock:
            changed = []
            for cluster in reversed(self._changed_at):  # newest first, up to the first change already seen
                if self._changed_at[cluster] <= mark:
                    break
                changed.append(cluster)
            return self._changes, changed

    def copy_of(self, key: RankKey) -> ReportedRank | None:
        """A copy to change: the published state changes only after COMMIT (a failed batch leaves it)."""
        state = self._ranks.get(key)
        return None if state is None else state.copy()

    def states(self, keys: Iterable[RankKey]) -> dict[RankKey, ReportedRank]:
        with self._lock:
            return {key: self._ranks[key] for key in keys if key in self._ranks}

    def silent_since(self, before_unix_s: float) -> list[RankKey]:
        """The ranks last heard from before ``before_unix_s``."""
        with self._lock:
            return [key for key, state in self._ranks.items() if state.received_unix_s < before_unix_s]

    def counts(self) -> tuple[int, int]:
        """How many clusters and ranks are held."""
        with self._lock:
            return len(self._by_cluster), len(self._ranks)

    def holds(self, key: RankKey) -> bool:
        return key in self._ranks

    def holds_cluster(self, cluster: str) -> bool:
        return cluster in self._by_cluster

    def clusters(self) -> list[str]:
        with self._lock:
            return sorted(self._by_cluster)

    def generation(self, cluster: str) -> int:
        return self._generations.get(cluster, 0)

    def cluster_states(self, cluster: str) -> list[ReportedRank]:
        with self._lock:
            states = list(self._by_cluster.get(cluster, {}).values())
        return sorted(states, key=lambda state: (state.role != "target", state.role, state.ep_rank))
