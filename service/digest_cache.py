"""The digests as last computed, per group, and the list kept as a ready answer: the cache of ``GroupDigests``
(``digests.py``). A digest is current while its key (the cluster's generation and its ranks' statuses) is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capwatch.service.digests import GroupDigest

Group = tuple[str, str]  # (cluster, role)


@dataclass
class CachedDigest:
    key: tuple
    digest: GroupDigest
    computed: float  # time.perf_counter() when computed
    full: bool = True  # False: listed from the ranks' states alone, to be computed


class DigestCache:
    """Each group's digest and key; the groups still to compute for their current key (``unfinished``); the list
    answer per ``all_roles`` until anything changes. Shares the coordinator's ``lock``."""

    def __init__(self, lock: threading.RLock):
        self.lock = lock
        self.entries: dict[Group, CachedDigest] = {}
        self.unfinished: set[Group] = set()
        self._answers: dict[bool, list[GroupDigest]] = {}

    def current(self, group: Group, key: tuple | None) -> GroupDigest | None:
        """The group's fully computed digest under ``key``; None when there is none."""
        cached = self.entries.get(group)
        if key is None or cached is None or cached.key != key or not cached.full:
            return None
        return cached.digest

    def keep(self, group: Group, key: tuple, digest: GroupDigest, full: bool) -> None:
        with self.lock:
            self.entries[group] = CachedDigest(key, digest, time.perf_counter(), full)
            self._answers.clear()

    def forget(self, group: Group) -> None:
        """A group that is gone (its cluster pruned, or its role's ranks)."""
        with self.lock:
            self.entries.pop(group, None)
            self.unfinished.discard(group)

    def answers_changed(self) -> None:
        self._answers.clear()

    def staleness(self, group: Group) -> tuple:
        """Never computed first, then the stalest."""
        cached = self.entries.get(group)
        return (cached is not None and cached.digest.view is not None, cached.computed if cached else 0.0)

    def answer(self, all_roles: bool, clusters: Callable[[], list[str]],
               roles_of: Callable[[str], list[str]]) -> list[GroupDigest]:
        """The list as kept: each cluster's groups (or its first, target first) in the clusters' order."""
        with self.lock:
            answer = self._answers.get(all_roles)
            if answer is None:
                answer = []
                for cluster in clusters():
                    roles = roles_of(cluster)
                    for role in roles if all_roles else roles[:1]:
                        cached = self.entries.get((cluster, role))
                        if cached is not None:  # a group newer than the refresher's last pass: not yet
                            answer.append(cached.digest)
                self._answers[all_roles] = answer
            return answer
