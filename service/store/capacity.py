"""How many clusters and ranks the store holds, within its bounds (``max_clusters``, ``max_ranks``): each costs
memory for as long as it is kept (its committed state, its digest, its gauges) and time on every read of the list,
so a flood of new names cannot grow them without end. A report that would add a cluster or a rank past a bound is
refused (``StoreFull``: 429 with Retry-After, so a rank keeps it buffered and retries); every report of a cluster
and rank already held is taken as before. Checked by the writer, batch by batch, against the committed ranks and
the ones the batch adds: exact, whatever the concurrency of the requests."""

from __future__ import annotations

from capwatch.service.store.errors import StoreFull
from capwatch.service.store.messages import PendingReport
from capwatch.service.store.rank_cache import RankCache


def within_bounds(batch: list[PendingReport], ranks: RankCache, max_clusters: int,
                  max_ranks: int) -> tuple[list[PendingReport], list[tuple[PendingReport, StoreFull]]]:
    """The reports there is room for, in their order, and the others with why not."""
    clusters, held = ranks.counts()
    new_clusters: set[str] = set()
    new_ranks: set[tuple[str, str, int]] = set()
    taken, refused = [], []
    for pending in batch:
        identity = pending.report.identity
        key = (identity.cluster, identity.role, identity.ep_rank)
        if key in new_ranks or ranks.holds(key):
            taken.append(pending)
            continue
        cluster_is_new = identity.cluster not in new_clusters and not ranks.holds_cluster(identity.cluster)
        if cluster_is_new and clusters + len(new_clusters) >= max_clusters:
            refused.append((pending, StoreFull(
                f"the service holds {max_clusters} clusters, its bound (CAPWATCH_MAX_CLUSTERS); cluster "
                f"{identity.cluster!r} is refused until one is pruned (silent longer than the retention) or the "
                "bound is raised")))
            continue
        if held + len(new_ranks) >= max_ranks:
            refused.append((pending, StoreFull(
                f"the service holds {max_ranks} ranks, its bound (CAPWATCH_MAX_RANKS); rank {identity.ep_rank} "
                f"({identity.role}) of cluster {identity.cluster!r} is refused until one is pruned or the bound is "
                "raised")))
            continue
        new_ranks.add(key)
        if cluster_is_new:
            new_clusters.add(identity.cluster)
        taken.append(pending)
    return taken, refused
