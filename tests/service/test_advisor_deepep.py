"""The advisor for ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` (a DeepEP group: ``GroupConfig.backend``):
priced in DeepEP buffer bytes and KV-cache tokens, never below the decode graph batch x tokens per request
(capture trips DeepEP's assertion below it), never above 1024 (SGLang asserts it), a multiple of 128 (FP8
scales), a warning where the buffer outgrows SGLang's flat 2048 MB reserve; the reasons name the rule that binds."""

from __future__ import annotations

import pytest
from capwatch.advisor.evidence import GroupConfig
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.recommend import recommend, whatif
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.sizing.checks import SizingError
from capwatch.sglang_engine.deepep import RESERVE_BYTES as SGLANG_DEEPEP_RESERVE_BYTES
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.deepep_plan import DeepEPPricing
from capwatch.sizing.model_presets import model_geometry
from capwatch.sglang_engine.limits import SGLangLimits
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.service.test_advisor import POLICY, day_of, history_from

DEEPSEEK = model_geometry("deepseek-v3")
KV_BYTES = DEEPSEEK.kv_cache.bytes_per_token()


def deepep_group(cap: int, mode: str = "low_latency", **kwargs) -> GroupConfig:
    plan = plan_deepep_buffer(DEEPSEEK, 8, 128, mode)
    pricing = DeepEPPricing(8, DEEPSEEK.hidden_size, plan.buffer_experts, plan.normal_nvl_bytes, plan.normal_rdma_bytes)
    return GroupConfig(cap=cap, pricing=pricing, backend=DEEPEP, kv_bytes_per_token=KV_BYTES,
                       prefill_dispatched=mode == "low_latency", **kwargs)


def peaks(low: int, high: int, cap: int):
    return history_from(day_of(lambda rng, window, rank: rng.randint(low, high)), cap=cap)


def test_quiet_decode_lowers_to_a_multiple_of_128_priced_in_buffer_bytes_and_kv_tokens():
    advice = recommend(peaks(40, 90, 1024), deepep_group(1024), POLICY)
    assert advice.action == "lower" and advice.recommended_cap == 128
    assert advice.env == "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=128"
    assert (advice.a2a_backend, advice.cap_variable) == ("deepep", DEEPEP.cap_env_var)
    at_1024, at_128 = (plan_deepep_buffer(DEEPSEEK, 8, cap, "low_latency").buffer_bytes_per_rank for cap in (1024, 128))
    assert advice.workspace_bytes_per_rank_current == at_1024 and advice.workspace_bytes_per_rank_recommended == at_128
    assert advice.kv_cache_tokens_per_rank_freed == (at_1024 - at_128) // KV_BYTES
    assert any("changes the buffer from" in reason for reason in advice.reasons)
    assert advice.over_sglang_reserve_bytes_recommended == 0  # 1.78 GiB: within SGLang's 2048 MB


def test_peaks_past_1024_are_capped_there_and_the_reason_says_so():
    advice = recommend(peaks(900, 1020, 1024), deepep_group(1024, "auto"), POLICY)
    assert advice.recommended_cap is None or advice.recommended_cap <= 1024
    assert advice.target_cap == 1024 and advice.upper_bound <= 1024
    assert any("capped at 1024" in reason and "SGLang asserts the cap <= 1024" in reason for reason in advice.reasons)


def test_the_decode_graph_floor_binds_and_is_named():
    limits = SGLangLimits(decode_cuda_graph_max_batch_size=160, tokens_per_request=2, max_prefill_buffer_tokens=8192)
    advice = recommend(peaks(20, 60, 1024), deepep_group(1024, "auto", engine_limits=limits), POLICY)
    # auto mode: prefill goes to normal mode (no cap), so the 8192-token prefill chunk is no term
    assert advice.floor_cap == 320 and advice.recommended_cap == 384
    assert "verify CUDA-graph batch 160 x 2 tokens per request" in advice.floor_binds
    assert any("raised to the floor 320" in reason and "DeepEP's dispatch assertion ends the rank" in reason
               for reason in advice.reasons)
    assert any("rounded up to 384, a multiple of 128" in reason and "FP8 scales" in reason for reason in advice.reasons)


def test_low_latency_mode_dispatches_prefill_too_so_its_chunk_binds():
    limits = SGLangLimits(decode_cuda_graph_max_batch_size=64, max_prefill_buffer_tokens=512)
    advice = recommend(peaks(20, 60, 1024), deepep_group(1024, "low_latency", engine_limits=limits), POLICY)
    assert advice.floor_cap == 512 and advice.recommended_cap == 512 and "prefill chunk" in advice.floor_binds


def test_a_floor_above_1024_cannot_be_met_and_the_advice_says_what_to_change():
    """No cap both passes DeepEP's start-up assertion (<= 1024) and holds the CUDA graph's batch: no advice, but
    one error that says what to change (the service answers it as a 409 for this group alone)."""
    limits = SGLangLimits(decode_cuda_graph_max_batch_size=512, tokens_per_request=4)
    with pytest.raises(SizingError, match=r"the floor is 2048 tokens .*above 1024.*lower --cuda-graph-max-bs"):
        recommend(peaks(20, 60, 1024), deepep_group(1024, "auto", engine_limits=limits), POLICY)


def test_a_buffer_past_sglangs_reserve_is_warned_about():
    advice = recommend(peaks(150, 210, 128), deepep_group(128), POLICY)  # overflowing: bumped 1.2x, then the margin
    assert advice.action == "raise" and advice.recommended_cap == 384
    over = plan_deepep_buffer(DEEPSEEK, 8, 384, "low_latency").buffer_bytes_per_rank - SGLANG_DEEPEP_RESERVE_BYTES
    assert advice.over_sglang_reserve_bytes_recommended == over > 0
    assert any("more than the 2.00 GiB SGLang's automatic --mem-fraction-static reserves" in reason
               for reason in advice.reasons)


def test_the_field_of_the_excess_over_the_reserve_is_the_engines():
    """``over_sglang_reserve_bytes_recommended`` is declared where the reserve is (the engine's ``RESERVE_PRICE``,
    capwatch.engines) and stays where ``/advice``'s JSON had it: right after the workspace's price."""
    from capwatch.advisor.advice import ClusterAdvice, Price
    from capwatch.engines import ENGINE

    assert list(ENGINE.RESERVE_PRICE.model_fields) == ["over_sglang_reserve_bytes_recommended"]
    assert issubclass(Price, ENGINE.RESERVE_PRICE)
    fields = list(ClusterAdvice.model_fields)
    assert fields[fields.index("kv_cache_tokens_per_rank_freed") + 1] == "over_sglang_reserve_bytes_recommended"
    assert Price.none().over_sglang_reserve_bytes_recommended is None


def test_the_policy_is_held_within_deepeps_rules():
    policy = AdvisorPolicy(alignment=64, max_cap=8192)
    within = policy.for_backend(DEEPEP)
    assert (within.alignment, within.max_cap) == (128, 1024)
    advice = recommend(peaks(100, 140, 1024), deepep_group(1024), policy)
    assert advice.recommended_cap % 128 == 0
    with pytest.raises(ValueError, match="leave none within the deepep rules"):
        AdvisorPolicy(alignment=2048, max_cap=4096).for_backend(DEEPEP)


def test_whatif_prices_deepep_caps_and_refuses_what_sglang_refuses():
    rows = whatif(peaks(40, 90, 1024), deepep_group(1024), [128, 256, 1024], POLICY)
    assert [row.workspace_bytes_per_rank for row in rows] == [
        plan_deepep_buffer(DEEPSEEK, 8, cap, "low_latency").buffer_bytes_per_rank for cap in (128, 256, 1024)]
    assert rows[0].kv_cache_tokens_per_rank_freed > 0 and rows[-1].kv_cache_tokens_per_rank_freed == 0
    with pytest.raises(SizingError, match="above 1024"):
        whatif(peaks(40, 90, 1024), deepep_group(1024), [2048], POLICY)


@settings(max_examples=120, deadline=None)
@given(low=st.integers(1, 1500), spread=st.integers(0, 400), cap=st.sampled_from(range(128, 1025, 128)),
       decode_graph=st.integers(0, 512), per_request=st.integers(1, 4), mode=st.sampled_from(["auto", "low_latency"]))
def test_advice_stays_within_deepeps_rules(low, spread, cap, decode_graph, per_request, mode):
    limits = SGLangLimits(disaggregation_mode="decode", decode_cuda_graph_max_batch_size=decode_graph,
                          tokens_per_request=per_request)
    history = history_from([[low + (window * 7919) % (spread + 1) for window in range(40)]], cap=cap)
    floor = decode_graph * per_request
    if floor > 1024:  # no cap both starts and holds the graph's batch: said, never advised
        with pytest.raises(SizingError, match="no cap both starts these ranks and fits"):
            recommend(history, deepep_group(cap, mode, engine_limits=limits), POLICY)
        return
    advice = recommend(history, deepep_group(cap, mode, engine_limits=limits), POLICY)
    if advice.recommended_cap is None:
        return
    assert advice.recommended_cap % 128 == 0 and advice.recommended_cap <= 1024
    if advice.action != "hold":
        assert advice.recommended_cap >= min(floor, 1024)
    assert advice.env == f"{DEEPEP.cap_env_var}={advice.recommended_cap}"


def test_a_memory_budget_clamps_to_the_largest_buffer_that_fits_and_never_asks_past_1024():
    """The advisor's budget stage searches DeepEP's buffer price as it does FlashInfer's (one search,
    ``sizing.caps.largest_aligned_cap``) and within DeepEP's 1024, where its pricing refuses more."""
    group = deepep_group(128)
    busy = peaks(600, 1000, 128)  # wants 1024
    fits_256 = group.pricing.bytes_per_rank(256) + 1
    advice = recommend(busy, group, POLICY.model_copy(update={"budget_bytes_per_rank": fits_256}))
    assert advice.budget_cap == 256 == group.pricing.largest_cap_within(fits_256)
    assert advice.recommended_cap == 256 and advice.workspace_bytes_per_rank_recommended < fits_256
    roomy = POLICY.model_copy(update={"budget_bytes_per_rank": group.pricing.bytes_per_rank(1024) * 4})
    assert recommend(busy, group, roomy).budget_cap == 1024
