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


def test_sglangs_words_mode_setting_and_own_code_reach_the_specs_through_bind():
    """What SGLang asserts of a cap, the server arg that picks a kernel mode and SGLang's own code for a backend
    (how it allocates it) are bound like its variable: the backends' sizing rules hold none of them."""
    from capwatch.sglang_engine import deepep, flashinfer
    from capwatch.sizing.deepep_plan import DEEPEP
    from capwatch.sizing.deepep_v2 import DEEPEP_V2
    from capwatch.sizing.flashinfer_releases import FLASHINFER as flashinfer_own

    assert (DEEPEP.why_max, DEEPEP.mode_setting, DEEPEP.engine_side, DEEPEP_V2.overflow_outcome) == (
        "", None, None, BackendCapRules("x").overflow_outcome)
    bound = SPECS["deepep"].rules
    assert bound.why_max == "SGLang asserts the cap <= 1024 at start-up" and bound.engine_side == deepep.__name__
    assert bound.required_alignment == 128 and "sglang#28994" in bound.why_aligned
    # --deepep-mode picks MoRI's kernel too: its spec reads the arg SGLang's home names
    assert SPECS["mori"].rules.mode_setting == bound.mode_setting == "deepep_mode"
    assert SPECS["flashinfer"].rules.engine_side == flashinfer.__name__ and SPECS["flashinfer"].rules.sized_for_group_bug
    assert not BackendCapRules("x").sized_for_group_bug and not flashinfer_own.sized_for_group_bug
    assert SPECS["deepep_v2"].rules.overflow_outcome.startswith("SGLang raises a ValueError")


@pytest.mark.parametrize("mode, low_latency", [("low_latency", True), ("auto", False), (None, False)])
def test_deepep_and_mori_read_their_kernel_mode_from_the_server_arg_sglang_names(mode, low_latency):
    """SGLang's --deepep-mode picks DeepEP's buffers and MoRI's kernel alike: both specs read the arg its home names,
    as the log reader hands them a server's logged args."""
    from capwatch.sglang_logs.server_args import _backend_params

    args = {"ep_num_redundant_experts": 32, "enforce_shared_experts_fusion": True}
    params = _backend_params({**args, "deepep_mode": mode} if mode else args)
    assert dict(params["mori"]) == {"low_latency": low_latency}
    assert dict(params["deepep"]) == {"deepep_mode": mode, "redundant_experts": 32, "shared_experts_fusion": True}
