"""The engine's own code for a backend (``BackendCapRules.engine_side``) meets the Protocol its spec states, checked
when the spec is imported: a side that lacks a member fails there, naming it."""

from __future__ import annotations

import dataclasses
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
    assert engine_side(rules, CONTRACTS[name]) is rules.engine_side


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_a_side_missing_a_member_is_refused_naming_it(name):
    side = SPECS[name].rules.engine_side
    missing = sorted(CONTRACTS[name].__annotations__)[0]
    partial = types.SimpleNamespace(**{key: getattr(side, key) for key in dir(side)
                                       if not key.startswith("_") and key != missing})
    with pytest.raises(TypeError, match="is SimpleNamespace; missing: " + missing + r"\)$"):
        engine_side(dataclasses.replace(SPECS[name].rules, engine_side=partial), CONTRACTS[name])
    with pytest.raises(TypeError, match="is NoneType; missing: " + missing + ", "):
        engine_side(dataclasses.replace(SPECS[name].rules, engine_side=None), CONTRACTS[name])
