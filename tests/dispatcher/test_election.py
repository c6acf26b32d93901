"""``dispatcher.counting.elect``: who leads the step, which places are the traffic sample, and, where a hook counts
the two halves of the traffic in two ops (DeepEP), which place counts what is received (``split_halves``): the
place after each sampled one, so a dispatch launches at most one op; as many places count each half."""

from __future__ import annotations

import pytest
import torch
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.counting import LayerCounting, elect
from hypothesis import given
from hypothesis import strategies as st

EP_SIZE = 2


def role(places: list[int]) -> tuple[DispatchCounters, list[LayerCounting]]:
    counters = DispatchCounters(16, EP_SIZE, torch.device("cpu"))
    return counters, [LayerCounting(counters, 0, EP_SIZE, counters.expert_traffic(4)) for _ in places]


# Each place once or twice (micro-batch twins), in any order of adoption.
PLACES = st.lists(st.integers(1, 2), min_size=1, max_size=70).flatmap(
    lambda twins: st.permutations([place for place, times in enumerate(twins) for _ in range(times)]))


@given(places=PLACES, stride=st.one_of(st.none(), st.integers(1, 20)), split=st.booleans())
def test_each_half_is_counted_by_as_many_places_and_split_halves_never_share_a_place_that_has_a_next(places, stride,
                                                                                                     split):
    counters, layers = role(places)
    elect(counters, layers, places, stride, split_halves=split)
    count = len(set(places))
    sampled = {place for place in range(count) if (place == 0 if stride is None else place % stride == 0)}
    for layer, place in zip(layers, places):  # micro-batch twins (one place) count alike
        assert layer.step_leader == (place == 0)
        assert layer.counts_traffic == (place in sampled)
    receiving = {place for layer, place in zip(layers, places) if layer.counts_received}
    if not split:
        assert receiving == sampled
        return
    assert len(receiving) == len(sampled)  # the received half is sampled as often as the sent half
    for place in sampled:
        hands_over = place + 1 < count and place + 1 not in sampled
        assert (place + 1 in receiving if hands_over else place in receiving)
        assert (place in receiving) == (not hands_over)  # both halves on one place only where there is no next
    assert counters.layers_per_step == count


@pytest.mark.parametrize("places, leader_receives", [([0, 1, 2], False), ([0, 0, 1, 1], False), ([0], True),
                                                     ([0, 0], True)], ids=["three places", "twins", "one place",
                                                                           "one place, twins"])
def test_deepep_s_election_hands_the_received_half_to_the_next_place_or_keeps_it_on_a_lone_place(places,
                                                                                               leader_receives):
    counters, layers = role(places)
    elect(counters, layers, places, traffic_stride=None, split_halves=True)
    assert [layer.counts_traffic for layer in layers] == [place == 0 for place in places]
    assert [layer.counts_received for layer in layers] == \
        [place == (0 if leader_receives else 1) for place in places]


def test_a_later_election_without_the_split_puts_both_halves_back_together():
    counters, layers = role([0, 1])
    elect(counters, layers, [0, 1], traffic_stride=None, split_halves=True)
    assert [layer.counts_received for layer in layers] == [False, True]
    elect(counters, layers, [0, 1], traffic_stride=None)
    assert [layer.counts_received for layer in layers] == [True, False]
