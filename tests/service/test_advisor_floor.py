"""SGLang's start-up floor as an advisor stage: never recommend a cap SGLang 0.5.23 would refuse
(arg_groups/moe_hook.py validate_flashinfer_a2a_token_budget), and say which term binds."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from capwatch.advisor.floor import deployment_floor
from capwatch.sglang_engine.floor import merged_sglang_limits
from capwatch.advisor.recommend import recommend, whatif
from capwatch.sglang_engine.limits import SGLangLimits
from tests.service.test_advisor import POLICY, PRICING, day_of, group, history_from

QUIET = history_from(day_of(lambda rng, w, r: rng.randint(50, 100)), cap=4096)


def required_by_sglang(mode: str, buffer: int, prefill_graph: int, decode_graph: int, per_request: int) -> int:
    """_required_flashinfer_a2a_dispatch_tokens_per_rank, restated from the wheel for the property test."""
    tokens = 0
    if mode != "decode":
        tokens = max(buffer, prefill_graph)
    if mode == "prefill":
        decode_graph = 0  # _decode_graph_dispatch_tokens_per_rank: (0, 1) on a prefill server
    return max(tokens, decode_graph * per_request)


def test_unified_server_is_floored_at_the_prefill_chunk():
    limits = SGLangLimits(max_prefill_buffer_tokens=8192, decode_cuda_graph_max_batch_size=256)
    advice = recommend(QUIET, group(16384, engine_limits=limits), POLICY)
    assert advice.floor_cap == 8192 and advice.recommended_cap == 8192 and advice.action == "lower"
    assert "prefill chunk" in advice.floor_binds
    assert any("raised to the floor 8192" in reason and "prefill chunk" in reason for reason in advice.reasons)


def test_pd_decode_server_ignores_the_prefill_chunk_and_binds_on_the_verify_graph():
    limits = SGLangLimits(disaggregation_mode="decode", max_prefill_buffer_tokens=16384,
                          decode_cuda_graph_max_batch_size=128, tokens_per_request=4)
    advice = recommend(QUIET, group(16384, engine_limits=limits), POLICY)
    assert advice.floor_cap == 512 and advice.recommended_cap == 512
    assert "verify CUDA-graph batch 128 x 4 tokens per request" in advice.floor_binds


def test_a_cap_below_the_floor_is_raised_even_on_quiet_traffic():
    limits = SGLangLimits(max_prefill_buffer_tokens=4096, prefill_cuda_graph_max_batch_size=6144)
    advice = recommend(QUIET, group(2048, engine_limits=limits), POLICY)
    assert advice.action == "raise" and advice.recommended_cap == 6144
    assert "prefill CUDA-graph batch" in advice.floor_binds
    rows = whatif(QUIET, group(2048, engine_limits=limits), [4096, 6144], POLICY)
    assert [row.below_floor for row in rows] == [True, False]


def test_the_group_takes_each_terms_largest_value_over_its_ranks():
    merged = merged_sglang_limits([
        {"max_prefill_buffer_tokens": 4096, "decode_cuda_graph_max_batch_size": 64, "tokens_per_request": 4},
        SGLangLimits(max_prefill_buffer_tokens=8192, decode_cuda_graph_max_batch_size=32),
        None])
    assert merged.max_prefill_buffer_tokens == 8192 and merged.decode_cuda_graph_max_batch_size == 64
    assert merged.tokens_per_request == 4
    assert merged_sglang_limits([None, {}]) is None


def test_on_sglang_0_5_21_capwatchs_rule_leaves_the_prefill_chunk_out_and_says_whose_rule_it_is():
    """0.5.19 - 0.5.21 send eager prefill through an all-gather and check nothing at start-up: the floor is
    the graph terms alone, and its reason says capwatch computed it and what happens below it."""
    limits = SGLangLimits(sglang_version="0.5.21", max_prefill_buffer_tokens=8192, prefill_cuda_graph_max_batch_size=0,
                          decode_cuda_graph_max_batch_size=256, floor_rule="capwatch")
    floor = deployment_floor(limits, None)
    assert floor.tokens == 256 and "decode CUDA-graph batch 256" in floor.binds
    assert "sglang 0.5.21 has no start-up check" in floor.why and "fails at run time" in floor.why
    advice = recommend(QUIET, group(16384, engine_limits=limits), POLICY)
    assert advice.floor_cap == 256 and advice.recommended_cap < 8192  # the chunk no longer holds the cap up
    assert deployment_floor(limits.model_copy(update={"floor_rule": "sglang"}), None).tokens == 8192


def test_a_group_mid_upgrade_takes_sglangs_own_rule():
    old = SGLangLimits(sglang_version="0.5.21", max_prefill_buffer_tokens=8192, floor_rule="capwatch")
    older = SGLangLimits(sglang_version="0.5.18", max_prefill_buffer_tokens=8192, floor_rule="capwatch_prefill")
    new = SGLangLimits(sglang_version="0.5.23", max_prefill_buffer_tokens=8192)
    assert merged_sglang_limits([old, old]).floor_rule == "capwatch"
    assert merged_sglang_limits([old, new]).floor_rule == "sglang"
    assert merged_sglang_limits([older, new, old]).floor_rule == "sglang"
    assert merged_sglang_limits([old, older]).floor_rule == "capwatch_prefill"  # the prefill chunk stays a term


def test_before_sglang_0_5_19_the_prefill_chunk_binds_but_nothing_checks_it_at_start_up():
    """0.5.18 and older (read from their logs) send prefill through the A2A with no start-up check: the chunk is
    in the floor, and its reason says a dispatch fails at run time, not that SGLang refuses to start."""
    limits = SGLangLimits(max_prefill_buffer_tokens=8192, decode_cuda_graph_max_batch_size=256,
                          floor_rule="capwatch_prefill")
    floor = deployment_floor(limits, None)
    assert floor.tokens == 8192 and "prefill chunk" in floor.binds
    assert "this SGLang release has no start-up check" in floor.why and "fails at run time" in floor.why
    advice = recommend(QUIET, group(16384, engine_limits=limits), POLICY)
    assert advice.floor_cap == 8192 and advice.recommended_cap >= 8192


@settings(max_examples=300, deadline=None)
@given(mode=st.sampled_from(["null", "prefill", "decode"]), buffer=st.integers(0, 40_000),
       prefill_graph=st.integers(0, 40_000), decode_graph=st.integers(0, 1024), per_request=st.integers(1, 16),
       peak=st.integers(1, 30_000), cap=st.integers(1, 40_000))
def test_advice_is_never_below_sglangs_rule(mode, buffer, prefill_graph, decode_graph, per_request, peak, cap):
    limits = SGLangLimits(disaggregation_mode=mode, max_prefill_buffer_tokens=buffer,
                          prefill_cuda_graph_max_batch_size=prefill_graph,
                          decode_cuda_graph_max_batch_size=decode_graph, tokens_per_request=per_request)
    required = required_by_sglang(mode, buffer, prefill_graph, decode_graph, per_request)
    floor = deployment_floor(limits, None)
    assert (floor.tokens if floor else 0) == required
    history = history_from([[peak] * 40], cap=cap)
    advice = recommend(history, group(cap, engine_limits=limits), POLICY)
    if advice.recommended_cap is not None:
        assert advice.recommended_cap >= required


@settings(max_examples=150, deadline=None)
@given(buffer=st.integers(0, 40_000), decode_graph=st.integers(0, 1024), per_request=st.integers(1, 16),
       peak=st.integers(1, 30_000), cap=st.integers(1, 40_000),
       budget_tokens=st.one_of(st.none(), st.integers(128, 40_000)), max_cap=st.integers(128, 40_000))
def test_neither_the_budget_nor_max_cap_pushes_advice_below_sglangs_rule(buffer, decode_graph, per_request, peak,
                                                                        cap, budget_tokens, max_cap):
    """A memory budget (or max_cap) below SGLang's floor cannot win: the server would refuse to start."""
    limits = SGLangLimits(max_prefill_buffer_tokens=buffer, decode_cuda_graph_max_batch_size=decode_graph,
                          tokens_per_request=per_request)
    required = required_by_sglang("null", buffer, 0, decode_graph, per_request)
    budget = None if budget_tokens is None else PRICING.bytes_per_rank(budget_tokens)
    policy = POLICY.model_copy(update={"budget_bytes_per_rank": budget, "max_cap": max_cap})
    advice = recommend(history_from([[peak] * 40], cap=cap), group(cap, engine_limits=limits), policy)
    if advice.recommended_cap is not None:
        assert advice.recommended_cap >= required
        if budget_tokens is not None and advice.budget_cap is not None and advice.budget_cap < required:
            assert any("the floor wins" in reason for reason in advice.reasons)


def test_a_budget_below_the_floor_is_reported_and_the_floor_wins():
    limits = SGLangLimits(max_prefill_buffer_tokens=2048)
    policy = POLICY.model_copy(update={"budget_bytes_per_rank": PRICING.bytes_per_rank(1024)})
    advice = recommend(QUIET, group(4096, engine_limits=limits), policy)
    assert advice.budget_cap == 1024 and advice.recommended_cap == 2048 and advice.action == "lower"
    assert any("below the floor 2048" in reason and "the floor wins" in reason for reason in advice.reasons)
