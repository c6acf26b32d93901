"""Each stage of the advisor's chain on its own, through the one interface they all have:
``stage(given: Evidence, sized: float) -> Step``. Over histories, floors, budgets and policies, each keeps
its own promise whatever the stage before it handed on."""

from __future__ import annotations

import math
import random

from capwatch.advisor.alignment import align
from capwatch.advisor.budget import clamp_to_budget
from capwatch.advisor.evidence import Evidence
from capwatch.advisor.floor import raise_to_floor
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.hysteresis import decide
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.recommend import SIZING, low_confidence_reason, recommend
from capwatch.advisor.sample import GroupSample
from capwatch.advisor.tail import size_for_risk
from capwatch.advisor.trend import size_for_trend
from capwatch.sglang_engine.limits import SGLangLimits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service.test_advisor import PRICING, group

T0 = 1_700_006_400.0


def history_of(samples: int, level: int, spread: float, growth: float, seed: int, cap: int) -> SampleHistory:
    rng = random.Random(seed)
    policy = AdvisorPolicy()
    history = SampleHistory(policy.half_life_s, window_s=60.0)
    for index in range(samples):
        peak = max(1, int(level * math.exp(growth * index / 1440) * (1 + spread * rng.expovariate(1.0))))
        history.add(GroupSample(T0 + 60.0 * index, peak, cap, int(peak > cap)), policy.bump_factor,
                    policy.bump_min_tokens)
    return history


evidences = st.builds(
    lambda samples, level, spread, growth, seed, cap, buffer, graph, budget_tokens, alignment, max_cap: Evidence(
        history_of(samples, level, spread, growth, seed, cap),
        group(cap, engine_limits=SGLangLimits(max_prefill_buffer_tokens=buffer, decode_cuda_graph_max_batch_size=graph)),
        AdvisorPolicy(budget_bytes_per_rank=None if budget_tokens is None else PRICING.bytes_per_rank(budget_tokens),
                      alignment=alignment, min_cap=alignment, max_cap=max_cap)),
    samples=st.integers(1, 6 * 1440), level=st.integers(20, 8000), spread=st.floats(0.0, 1.0),
    growth=st.sampled_from([0.0, 0.0, 0.05, -0.05]), seed=st.integers(0, 1000), cap=st.integers(1, 20_000),
    buffer=st.integers(0, 16_384), graph=st.integers(0, 512), budget_tokens=st.one_of(st.none(), st.integers(128, 20_000)),
    alignment=st.sampled_from([64, 128, 256]), max_cap=st.integers(256, 40_000))
tokens = st.floats(0.0, 60_000.0)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(evidence=evidences, sized=tokens)
def test_each_sizing_stage_keeps_its_promise(evidence, sized):
    policy, floor_cap = evidence.policy, evidence.floor_cap

    risk = size_for_risk(evidence, sized)
    if evidence.tail.fit is None:
        assert risk.value == sized  # no tail model: the margin before it stands
    else:  # an aligned cap above every remembered sample by the margin (or max_cap)
        remembered = evidence.history.estimator_histogram().percentile(1.0)
        assert risk.value % policy.alignment == 0
        assert risk.value >= min(remembered * (1 + policy.risk_min_margin), policy.max_cap // policy.alignment
                                 * policy.alignment)

    trended = size_for_trend(evidence, sized)
    assert trended.value >= sized  # growth raises; a decline is said, not acted on
    if trended.value > sized:
        assert evidence.trend.significant and evidence.trend.rate_per_day > 0 and trended.reasons

    floored = raise_to_floor(evidence, sized)
    assert floored.value == (sized if floor_cap is None else max(sized, floor_cap))
    assert bool(floored.reasons) == (floored.value != sized)

    aligned = align(evidence, sized)
    assert aligned.value % policy.alignment == 0 and aligned.value >= policy.min_cap
    ceiling = max(policy.max_cap // policy.alignment * policy.alignment,
                  -(-(floor_cap or 0) // policy.alignment) * policy.alignment)
    assert aligned.value >= min(sized, ceiling) and aligned.value <= max(ceiling, policy.min_cap)

    budgeted = clamp_to_budget(evidence, aligned.value)
    assert budgeted.value <= aligned.value  # a budget only lowers
    if evidence.budget_cap is not None and budgeted.value > evidence.budget_cap:  # only the floor outranks it
        assert floor_cap is not None and evidence.budget_cap < floor_cap
        assert any("the floor wins" in reason for reason in budgeted.reasons)
    if floor_cap is not None and aligned.value >= floor_cap:
        assert budgeted.value >= floor_cap  # and never below the floor


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(evidence=evidences, sized=st.integers(1, 60_000))
def test_decide_holds_or_moves_to_the_target_inside_its_band(evidence, sized):
    decided = decide(evidence, sized)
    decision, current = decided.value, evidence.current_cap
    assert decision.target_cap == sized and len(decided.reasons) == 1
    assert decision.lower_bound <= sized <= decision.upper_bound
    assert decision.recommended_cap == (current if decision.action == "hold" else sized)
    assert decision.action == "hold" or (decision.action == "raise") == (sized > current)
    if evidence.overflow_now > 0 and sized > current:
        assert decision.action == "raise"  # a cap being exceeded is raised now, whatever the hysteresis says


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(evidence=evidences)
def test_the_advice_gives_the_stages_reasons_in_chain_order(evidence):
    advice = recommend(evidence.history, evidence.group, evidence.policy)
    if advice.action == "insufficient_data":
        return
    sized, reasons = 0.0, []
    for stage in SIZING:
        step = stage(evidence, sized)
        sized, reasons = step.value, reasons + list(step.reasons)
    decided = decide(evidence, sized)
    assert advice.target_cap == decided.value.target_cap and advice.action == decided.value.action
    lead = [low_confidence_reason(evidence)] if decided.value.low_confidence else []  # said first
    assert advice.reasons[:len(lead) + len(reasons) + 1] == [*lead, *reasons, *decided.reasons]
