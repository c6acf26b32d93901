"""spawn_ranks: a real gloo group, results by rank, failures reported clearly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.demo.ranks import RankFailedError, RankFailure, root_cause, spawn_ranks

from .rank_functions import (crash_while_peer_waits, exit_without_reporting, fail_on_rank_one, group_facts,
                             peer_fails_first)


def test_a_child_exception_is_raised_with_its_traceback():
    with pytest.raises(RankFailedError) as caught:
        spawn_ranks(2, fail_on_rank_one, timeout_s=60)
    assert caught.value.rank == 1
    assert "ValueError: boom from rank one" in str(caught.value)
    assert "fail_on_rank_one" in caught.value.detail


def test_the_root_cause_is_reported_even_when_a_peer_failure_arrives_first():
    with pytest.raises(RankFailedError) as caught:
        spawn_ranks(2, peer_fails_first, timeout_s=60)
    assert caught.value.rank == 1
    assert "ValueError: the root cause, on rank one" in caught.value.detail
    assert [other.rank for other in caught.value.others] == [0]  # the peer's lost connection, as a consequence
    assert "rank 0:" in str(caught.value)


def test_a_silent_death_is_blamed_over_the_peer_it_leaves_waiting():
    with pytest.raises(RankFailedError, match="exit code 9") as caught:
        spawn_ranks(2, crash_while_peer_waits, timeout_s=60)
    assert caught.value.rank == 1


def test_a_child_that_dies_silently_reports_its_exit_code():
    with pytest.raises(RankFailedError, match="exit code 7") as caught:
        spawn_ranks(1, exit_without_reporting, timeout_s=60)
    assert caught.value.exitcode == 7


def test_bad_world_size_is_refused():
    with pytest.raises(ValueError, match="world_size must be positive"):
        spawn_ranks(0, group_facts, "x")


# spawn_ranks returning each rank's result in rank order is checked by test_multirank.


@given(st.lists(st.tuples(st.integers(0, 63), st.sampled_from(["raised", "peer", "died"])), min_size=1, max_size=8,
                unique_by=lambda failure: failure[0]))
def test_the_blame_goes_to_a_ranks_own_error_then_a_silent_death_then_the_first_report(noticed):
    failures = [RankFailure(rank, kind, f"Traceback ...\n{kind} on rank {rank}") for rank, kind in noticed]
    error = root_cause(failures)
    kinds = [kind for _, kind in noticed]
    expected = next(kind for kind in ("raised", "died", "peer") if kind in kinds)
    first_of_kind = next(rank for rank, kind in noticed if kind == expected)
    assert error.rank == first_of_kind
    assert sorted(other.rank for other in error.others) == sorted(rank for rank, _ in noticed if rank != first_of_kind)
    assert all(f"rank {other.rank}: {other.kind} on rank {other.rank}" in str(error) for other in error.others)
