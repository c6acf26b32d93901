"""SGLang's side of every backend's cap lives once, in sglang_engine/caps.py: the registry's specs carry it, the
backends' own sizing rules do not restate it."""

from __future__ import annotations

import dataclasses

import pytest
from capwatch.backends import SPECS
from capwatch.sglang_engine.caps import CAPS, bind
from capwatch.sizing.backends import BackendCapRules


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_registered_backend_carries_sglangs_variable_default_and_reserve(name):
    rules, cap = SPECS[name].rules, CAPS[name]
    assert rules.cap_env_var == cap.variable and rules.cap_env_var.startswith("SGLANG_")
    assert (rules.default_cap, rules.engine_reserve_bytes) == (cap.default_cap, cap.reserve_bytes)
    assert rules.env_line(64) == f"{cap.variable}=64"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_backends_own_rules_leave_the_engines_facts_to_the_engine(name):
    """The sizing module's rules (what bind is given) name no variable: the fact is CAPS' alone."""
    own = dataclasses.replace(SPECS[name].rules, cap_env_var="", default_cap=None, engine_reserve_bytes=None)
    assert bind(own) == SPECS[name].rules


def test_a_backend_sglang_does_not_know_keeps_its_own_rules():
    rules = BackendCapRules("not_in_sglang", cap_env_var="SOME_VARIABLE")
    assert bind(rules) is rules
