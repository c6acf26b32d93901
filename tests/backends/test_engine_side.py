"""The engine's own code for a backend (``BackendCapRules.engine_side``) meets the Protocol its spec states, checked
when the spec is imported: a side that lacks a member fails there, naming it."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle
import types

import pytest
from capwatch.backends import SPECS
from capwatch.backends.deepep import DeepEPEngineSide
from capwatch.backends.flashinfer import FlashInferEngineSide
from capwatch.backends.spec import engine_side

CONTRACTS = {"deepep": DeepEPEngineSide, "flashinfer": FlashInferEngineSide}


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_the_bound_engine_side_meets_its_spec_contract(name):
    rules = SPECS[name].rules
    assert engine_side(rules, CONTRACTS[name]) is importlib.import_module(rules.engine_side)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_a_side_missing_a_member_is_refused_naming_it(name):
    side = importlib.import_module(SPECS[name].rules.engine_side)
    missing = sorted(CONTRACTS[name].__annotations__)[0]
    partial = types.SimpleNamespace(**{key: getattr(side, key) for key in dir(side)
                                       if not key.startswith("_") and key != missing})
    with pytest.raises(TypeError, match="is SimpleNamespace; missing: " + missing + r"\)$"):
        engine_side(dataclasses.replace(SPECS[name].rules, engine_side=partial), CONTRACTS[name])
    with pytest.raises(TypeError, match="is NoneType; missing: " + missing + ", "):
        engine_side(dataclasses.replace(SPECS[name].rules, engine_side=None), CONTRACTS[name])


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_specs_rules_are_plain_data_an_overflow_event_can_carry(name):
    """The rules travel in every ``OverflowEvent`` (its ``on_overflow`` callbacks, a test's ``dataclasses.asdict``):
    copied, pickled and turned into a dict whole. A module bound as the engine's side broke all three."""
    from capwatch.dispatcher.counting import OverflowEvent

    rules = SPECS[name].rules
    assert copy.deepcopy(rules) == rules and pickle.loads(pickle.dumps(rules)) == rules
    assert pickle.loads(pickle.dumps(rules)).engine_side == rules.engine_side
    event = OverflowEvent(kind="runtime_over_cap", outcome="raised", cap=8, runtime_max_tokens_per_rank=9,
                          local_tokens=9, tokens_needed=9, suggested_cap=128, role="target", ep_rank=0, ep_size=2,
                          rules=rules)
    assert dataclasses.asdict(event)["rules"]["name"] == name
