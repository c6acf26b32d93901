"""The store's log of changes (``RankCache.changed_since``): what the list's digests read instead of every
cluster's generation. Whatever the order of reports, folds and prunes, a reader that asks with the mark it was
last given learns exactly the clusters changed since, each once, and nothing it already saw."""

from __future__ import annotations

from capwatch.service.store.rank_cache import RankCache
from hypothesis import given
from hypothesis import strategies as st

CLUSTERS = ("a", "b", "c", "d")
STEPS = st.lists(st.one_of(
    st.tuples(st.just("changed"), st.lists(st.sampled_from(CLUSTERS), max_size=3)),  # reports, a fold
    st.tuples(st.just("forget"), st.lists(st.sampled_from(CLUSTERS), max_size=2)),  # pruned ranks
    st.tuples(st.just("look"), st.just([])),  # a reader takes what changed since its mark
), max_size=30)


@given(steps=STEPS)
def test_a_reader_learns_exactly_the_clusters_changed_since_its_mark(steps):
    ranks = RankCache({})
    mark, unseen = 0, set()
    for step, clusters in steps:
        if step == "changed":
            ranks.changed(clusters)
            unseen.update(clusters)
        elif step == "forget":
            ranks.forget((cluster, "target", 0) for cluster in clusters)
            unseen.update(clusters)
        else:
            mark, changed = ranks.changed_since(mark)
            assert sorted(changed) == sorted(unseen)  # each once, none seen before
            unseen = set()
    assert sorted(ranks.changed_since(0)[1]) == sorted({c for step, cs in steps if step != "look" for c in cs})
