"""DeepEP's buffer as SGLang sizes it: the layout's own properties, the experts SGLang gives DeepEP, the modes,
the refusals, and the largest cap within a budget (``capwatch.sizing.deepep_*``). The bytes themselves are
checked against DeepEP's and SGLang's code in ``test_against_deepep.py``."""

from __future__ import annotations

import pytest
from capwatch.sizing.checks import SizingError
from capwatch.sizing.deepep_low_latency import (
    LOW_LATENCY_HIDDEN_SIZES,
    MAX_DISPATCH_TOKENS_PER_RANK,
    low_latency_layout,
    low_latency_rdma_bytes,
)
from capwatch.sizing.deepep_normal import DISPATCH_CONFIGS, default_configs
from capwatch.sglang_engine.deepep import (
    RESERVE_BYTES as SGLANG_DEEPEP_RESERVE_BYTES,
    NoDeepEPCapFits,
    buffer_experts,
    largest_deepep_plan_within,
    plan_deepep_buffer,
)
from capwatch.sizing.deepep_plan import NVSHMEM_HEAP_STEP_BYTES, DeepEPPricing
from capwatch.sizing.model_presets import custom_geometry, model_geometry
from hypothesis import given
from hypothesis import strategies as st

DEEPSEEK_V3 = model_geometry("deepseek-v3")
hidden_sizes = st.sampled_from(LOW_LATENCY_HIDDEN_SIZES)
caps = st.integers(1, MAX_DISPATCH_TOKENS_PER_RANK)
experts = st.integers(1, 1024)


@given(caps, caps, hidden_sizes, experts)
def test_the_buffer_grows_with_the_cap(first, second, hidden, count):
    low, high = sorted((first, second))
    assert low_latency_rdma_bytes(low, hidden, count) <= low_latency_rdma_bytes(high, hidden, count)


@given(caps, hidden_sizes, experts)
def test_the_layout_adds_up_and_aligns(cap, hidden, count):
    layout = low_latency_layout(cap, hidden, count)
    assert layout.total_bytes == 2 * (layout.send_buffer_bytes + layout.receive_buffer_bytes
                                      + layout.signaling_buffer_bytes)
    assert layout.rdma_bytes % 128 == 0 and layout.total_bytes < layout.rdma_bytes <= layout.total_bytes + 128
    # every (expert, token) pair has a receive slot big enough for either message
    assert layout.receive_buffer_bytes >= count * cap * max(layout.dispatch_message_bytes,
                                                            layout.combine_message_bytes)


@given(caps, st.sampled_from([1, 2, 8, 16, 32, 64, 128]), st.sampled_from([1, 2, 8, 16, 32, 64, 128]))
def test_the_low_latency_buffer_does_not_depend_on_the_rank_count(cap, ranks, other_ranks):
    experts_for_both = 256  # divides by every rank count above
    one = plan_deepep_buffer(DEEPSEEK_V3, ranks, cap, "low_latency")
    two = plan_deepep_buffer(DEEPSEEK_V3, other_ranks, cap, "low_latency")
    assert one.buffer_experts == two.buffer_experts == experts_for_both
    assert one.buffer_bytes_per_rank == two.buffer_bytes_per_rank


def test_deepseek_v3_figures_the_issue_quotes():
    at_128 = plan_deepep_buffer(DEEPSEEK_V3, 8, 128)
    assert at_128.low_latency_rdma_bytes == 1_908_410_496 and at_128.normal_nvl_bytes == 335_709_824
    assert (at_128.num_rdma_bytes, at_128.num_nvl_bytes) == (1_908_410_496, 335_709_824)
    assert at_128.buffer_bytes_per_rank == 1_908_410_496 + 335_709_824
    assert plan_deepep_buffer(DEEPSEEK_V3, 64, 128, "low_latency").buffer_bytes_per_rank == 1_908_410_496
    assert 15.2e9 < plan_deepep_buffer(DEEPSEEK_V3, 8, 1024).low_latency_rdma_bytes < 15.4e9
    # SGLang's flat 2048 MB is already too little at T = 256
    assert plan_deepep_buffer(DEEPSEEK_V3, 8, 128, "low_latency").over_sglang_reserve_bytes == 0
    assert plan_deepep_buffer(DEEPSEEK_V3, 8, 256, "low_latency").over_sglang_reserve_bytes > 0


def test_experts_are_routed_plus_redundant_plus_one_slot_per_rank_per_fused_shared_expert():
    # deepseek_v2.py: "256 routed + EP_size shared slots = 272 experts total (for EP=16)"
    assert buffer_experts(256, 16, fused_shared_experts=1) == 272
    assert buffer_experts(256, 8, redundant_experts=32) == 288
    plan = plan_deepep_buffer(DEEPSEEK_V3, 16, 128, "low_latency", redundant_experts=32,
                              fused_shared_experts=DEEPSEEK_V3.shared_experts)
    assert plan.buffer_experts == 256 + 32 + 16
    assert plan.low_latency_rdma_bytes == low_latency_rdma_bytes(128, 7168, 304)


def test_auto_mode_takes_the_larger_rdma_and_adds_normal_modes_nvl():
    plan = plan_deepep_buffer(model_geometry("qwen3-30b-a3b"), 64, 64)
    assert plan.num_rdma_bytes == max(plan.normal_rdma_bytes, plan.low_latency_rdma_bytes)
    assert plan.buffer_bytes_per_rank == plan.num_nvl_bytes + plan.num_rdma_bytes
    assert plan.normal_nvl_bytes > 0 and plan.normal_rdma_bytes > 0  # 64 ranks span 8 NVLink domains
    assert plan_deepep_buffer(DEEPSEEK_V3, 8, 64).normal_rdma_bytes == 0  # one NVLink domain: no RDMA in normal mode
    low_latency = plan_deepep_buffer(model_geometry("qwen3-30b-a3b"), 64, 64, "low_latency")
    assert (low_latency.num_nvl_bytes, low_latency.normal_rdma_bytes) == (0, 0)


def test_the_plan_says_what_sglang_and_nvshmem_set_around_the_buffer():
    plan = plan_deepep_buffer(DEEPSEEK_V3, 8, 1024, "low_latency")
    assert plan.nvshmem_qp_depth == 2 * (1024 + 1)
    assert plan.nvshmem_heap_bytes_at_least % NVSHMEM_HEAP_STEP_BYTES == 0
    assert plan.num_rdma_bytes <= plan.nvshmem_heap_bytes_at_least < plan.num_rdma_bytes + NVSHMEM_HEAP_STEP_BYTES
    assert plan.over_sglang_reserve_bytes == plan.buffer_bytes_per_rank - SGLANG_DEEPEP_RESERVE_BYTES


@pytest.mark.parametrize(("call", "message"), [
    (lambda: plan_deepep_buffer(model_geometry("gpt-oss-120b"), 8, 128), "do not run hidden size 2880"),
    (lambda: plan_deepep_buffer(DEEPSEEK_V3, 8, 1025), "above 1024"),
    (lambda: plan_deepep_buffer(DEEPSEEK_V3, 8, 0), "cap must be positive"),
    (lambda: plan_deepep_buffer(DEEPSEEK_V3, 12, 128, "low_latency", redundant_experts=1), "do not divide"),
    (lambda: plan_deepep_buffer(DEEPSEEK_V3, 12, 128, "auto", redundant_experts=8), "no normal-mode config for 12"),
    (lambda: plan_deepep_buffer(DEEPSEEK_V3, 8, 128, "normal"), "unknown DeepEP mode 'normal'"),
    (lambda: plan_deepep_buffer(DEEPSEEK_V3, 8, 128, redundant_experts=-1), "redundant_experts must be >= 0"),
])
def test_what_sglang_or_deepep_refuse_is_refused_in_one_line(call, message):
    with pytest.raises(SizingError) as refused:
        call()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_low_latency_mode_runs_on_rank_counts_without_a_normal_config():
    assert 12 not in DISPATCH_CONFIGS
    plan = plan_deepep_buffer(custom_geometry(4096, 8, 96), 12, 128, "low_latency")
    assert plan.buffer_bytes_per_rank == low_latency_rdma_bytes(128, 4096, 96)
    with pytest.raises(SizingError):
        default_configs(12)


@given(st.integers(1 << 20, 40 << 30), st.sampled_from([0, 32]), st.sampled_from(["auto", "low_latency"]))
def test_the_largest_cap_within_a_budget_is_the_largest_that_fits(budget, redundant, mode):
    options = dict(geometry=DEEPSEEK_V3, ep_size=8, deepep_mode=mode, redundant_experts=redundant)
    # held against all the memory the buffer takes (issue #31: the NVSHMEM heap's 512 MiB steps, the NVLink buffer
    # and DeepEP's workspace), not the buffer's bytes alone
    fitting = [cap for cap in range(128, 1025, 128) if plan_deepep_buffer(cap=cap, **options).memory_bytes_per_rank
               <= budget]
    if not fitting:
        with pytest.raises(NoDeepEPCapFits):
            largest_deepep_plan_within(budget, **options)
        return
    assert largest_deepep_plan_within(budget, **options).cap == max(fitting)


def test_pricing_from_a_report_matches_the_plan_and_refuses_what_it_does_not_know():
    plan = plan_deepep_buffer(DEEPSEEK_V3, 16, 256, redundant_experts=16)
    pricing = DeepEPPricing(16, 7168, plan.buffer_experts, plan.normal_nvl_bytes, plan.normal_rdma_bytes)
    assert pricing.bytes_per_rank(256) == plan.buffer_bytes_per_rank
    assert pricing.largest_cap_within(plan.buffer_bytes_per_rank) == 256
    unknown = DeepEPPricing(16, None, None)
    assert unknown.known_bytes_per_rank(256) is None
    with pytest.raises(SizingError, match="cannot be priced"):
        unknown.bytes_per_rank(256)


def test_deepeps_own_limit_names_no_engine_and_sglangs_assert_says_sglang():
    """1024 is DeepEP's (the low-latency dispatch counts below FINISHED_SUM_TAG); that SGLang asserts it at start is
    SGLang's fact, said by its home."""
    from capwatch.sglang_engine.deepep import check_cap
    from capwatch.sizing.deepep_low_latency import check_dispatch_cap

    with pytest.raises(SizingError) as library:
        check_dispatch_cap(1025)
    with pytest.raises(SizingError) as engine:
        check_cap(1025)
    assert "SGLang" not in str(library.value) and "FINISHED_SUM_TAG" in str(library.value)
    assert "the most SGLang accepts for DeepEP's low-latency dispatch (it asserts the cap <= 1024" in str(engine.value)
    assert check_cap(1024) == check_dispatch_cap(1024) == 1024

