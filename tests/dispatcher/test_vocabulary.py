"""The shared vocabulary: one spelling of every word, one alignment, and the copies that still
exist elsewhere agree with it (until they import it)."""

from __future__ import annotations

import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.dispatcher import vocabulary


@pytest.mark.parametrize("literal, values", [
    (vocabulary.Role, vocabulary.ROLES), (vocabulary.OverflowPolicy, vocabulary.OVERFLOW_POLICIES),
    (vocabulary.OverflowKind, vocabulary.OVERFLOW_KINDS), (vocabulary.OverflowOutcome, vocabulary.OVERFLOW_OUTCOMES),
    (vocabulary.Action, vocabulary.ACTIONS), (vocabulary.RankState, vocabulary.RANK_STATES),
])
def test_each_tuple_is_its_literal(literal, values):
    assert values == typing.get_args(literal) and len(set(values)) == len(values)


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=1, max_value=1 << 12))
def test_align_up_and_down_bracket_the_value_on_the_grain(value, alignment):
    up, down = vocabulary.align_up(value, alignment), vocabulary.align_down(value, alignment)
    assert up % alignment == 0 and down % alignment == 0
    assert down <= value <= up and up - down in (0, alignment)
    assert (up == value) == (value % alignment == 0)


def test_alignment_defaults_to_the_cap_grain_and_refuses_nonsense():
    assert (vocabulary.align_up(1), vocabulary.align_up(128), vocabulary.align_up(129), vocabulary.align_up(0)) \
        == (128, 128, 256, 0)
    assert vocabulary.align_up(300.5) == 384
    with pytest.raises(ValueError, match="alignment must be positive"):
        vocabulary.align_up(5, 0)


def test_the_copies_elsewhere_spell_the_same_words():
    """Each still has its own copy (see the consolidation report); a drift fails here first."""
    from capwatch.dispatcher import instrumented, workspace_plan
    from capwatch.telemetry.report import OverflowCount, RankConfig, RankIdentity

    assert instrumented.CAP_ENV_VAR == vocabulary.CAP_ENV_VAR
    assert instrumented.CAP_ALIGNMENT == workspace_plan.CAP_ALIGNMENT == vocabulary.CAP_ALIGNMENT
    assert instrumented.OVERFLOW_POLICIES == vocabulary.OVERFLOW_POLICIES
    assert typing.get_args(RankIdentity.model_fields["role"].annotation) == vocabulary.ROLES
    assert typing.get_args(RankConfig.model_fields["overflow_policy"].annotation) == vocabulary.OVERFLOW_POLICIES
    assert typing.get_args(OverflowCount.model_fields["kind"].annotation) == vocabulary.OVERFLOW_KINDS
    assert typing.get_args(OverflowCount.model_fields["outcome"].annotation) == vocabulary.OVERFLOW_OUTCOMES
    for needed in (1, 127, 128, 129, 4097):
        assert instrumented.suggested_cap(needed) == max(vocabulary.CAP_ALIGNMENT, vocabulary.align_up(needed))


def test_the_services_copies_spell_the_same_words():
    pytest.importorskip("fastapi")
    from capwatch.service import aggregate, metrics

    assert metrics.ACTIONS == vocabulary.ACTIONS and metrics.RANK_STATES == vocabulary.RANK_STATES
    assert typing.get_args(aggregate.RankStatus) == vocabulary.RANK_STATES
