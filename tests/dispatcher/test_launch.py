"""spawn_ranks: a real gloo group, results by rank, failures reported clearly."""

from __future__ import annotations

import pytest

from capwatch.dispatcher.launch import RankFailedError, spawn_ranks

from .rank_functions import exit_without_reporting, fail_on_rank_one, group_facts


def test_a_child_exception_is_raised_with_its_traceback():
    with pytest.raises(RankFailedError) as caught:
        spawn_ranks(2, fail_on_rank_one, timeout_s=60)
    assert caught.value.rank == 1
    assert "ValueError: boom from rank one" in str(caught.value)
    assert "fail_on_rank_one" in caught.value.detail


def test_a_child_that_dies_silently_reports_its_exit_code():
    with pytest.raises(RankFailedError, match="exit code 7") as caught:
        spawn_ranks(1, exit_without_reporting, timeout_s=60)
    assert caught.value.exitcode == 7


def test_bad_world_size_is_refused():
    with pytest.raises(ValueError, match="world_size must be positive"):
        spawn_ranks(0, group_facts, "x")


# spawn_ranks returning each rank's result in rank order is checked by test_multirank.
