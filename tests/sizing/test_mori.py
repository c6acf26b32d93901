"""MoRI's op as SGLang configures it, priced from MoRI v1.2.2's allocations (``capwatch.sizing.mori``).

The figures below are worked by hand from MoRI v1.2.2's ``dispatch_combine.cpp`` for DeepSeek-V3 (H 7168, top-8,
256 experts) on 8 ranks, bf16, T = 4096: no MoRI runs here to check them against."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.backends import spec_of
from capwatch.sizing.checks import SizingError
from capwatch.sizing.mori import MORI, MoriOpConfig, MoriPricing, kernel_type, mori_op_plan

V3 = MoriOpConfig(ep_size=8, hidden_size=7168, top_k=8, experts_per_rank=32)


def test_deepseek_v3_intranode_by_hand():
    plan = mori_op_plan(V3, 4096)
    transfer = 7168 * 2 + 8 * 4 + 8 * 4 + 4  # token, indices, weights, source id
    assert plan.transfer_bytes_per_token == transfer == 14404
    received = 8 * 4096
    assert plan.received_tokens == received
    # combine input (R x transfer) + dispatch output (R x H x 2) + combine output (T x H x 2)
    assert plan.token_buffers_bytes == received * 14404 + received * 14336 + 4096 * 14336 == 1_000_472_576
    # 3 weight buffers and 2 index buffers of R x top-k x 4, no scales in bf16
    assert plan.weights_scales_indices_bytes == 5 * received * 8 * 4 == 5_242_880
    # 6 order maps of ep x T x experts-per-rank int32 (+ counters and the inter-node maps of one node)
    assert plan.order_maps_bytes == 6 * 8 * 4096 * 32 * 4 + 2 * 8 * 4 + 2 * 4 + 4 + 4096 * 8 * 4 + 4096 * 4
    assert plan.op_bytes == plan.token_buffers_bytes + plan.weights_scales_indices_bytes + plan.signals_bytes \
        + plan.order_maps_bytes


def test_the_kernel_follows_the_server_and_low_latency_costs_more():
    assert kernel_type(8, 4096, False) == "IntraNode"
    assert kernel_type(16, 256, False) == "InterNodeV1LL" and kernel_type(16, 257, False) == "InterNodeV1"
    assert kernel_type(8, 4096, True) == "AsyncLL"
    low_latency = MoriOpConfig(8, 7168, 8, 32, "AsyncLL")
    # AsyncLL stages all ranks' tokens three times over instead of one combine input
    assert mori_op_plan(low_latency, 4096).op_bytes > mori_op_plan(V3, 4096).op_bytes
    inter = MoriPricing(16, MoriOpConfig(16, 7168, 8, 16, "InterNodeV1"))
    assert inter.config_at(128).kernel == "InterNodeV1LL" and inter.config_at(512).kernel == "InterNodeV1"


def test_fp8_dispatch_scales_and_a_smaller_receive_side():
    fp8 = MoriOpConfig(8, 7168, 8, 32, scale_dim=56, scale_type_size=4)
    assert mori_op_plan(fp8, 4096).transfer_bytes_per_token == 14404 + 56 * 4
    prealloc = MoriOpConfig(8, 7168, 8, 32, max_total_recv_tokens=8192)
    assert mori_op_plan(prealloc, 4096).received_tokens == 8192
    assert mori_op_plan(prealloc, 512).received_tokens == 4096  # never more than every rank's T


@given(st.sampled_from(["IntraNode", "AsyncLL"]), st.integers(1, 1 << 14), st.integers(1, 1 << 14),
       st.sampled_from(["none", "fp8_blockwise", "fp8_direct_cast", "fp4_blockwise"]))
def test_the_op_grows_with_the_cap(kernel, smaller, larger, quant):
    config = MoriOpConfig(8, 4096, 8, 16, kernel, combine_quant=quant)
    low, high = sorted((smaller, larger))
    assert mori_op_plan(config, low).op_bytes <= mori_op_plan(config, high).op_bytes


def test_largest_cap_within_a_budget_and_refusals():
    pricing = MoriPricing(8, V3)
    cap = pricing.largest_cap_within(pricing.bytes_per_rank(2048))
    assert cap == 2048 and pricing.bytes_per_rank(cap + 128) > pricing.bytes_per_rank(2048)
    assert MoriPricing(8, None).known_bytes_per_rank(128) is None
    with pytest.raises(SizingError, match="whole nodes"):
        MoriOpConfig(12, 7168, 8, 16, "InterNodeV1")
    with pytest.raises(SizingError, match="kernel"):
        MoriOpConfig(8, 7168, 8, 16, "Mystery")
    with pytest.raises(SizingError):
        pricing.bytes_per_rank(MORI.max_cap_tokens + 1)
    rules = spec_of("mori").rules  # with the engine's variable and default
    assert rules.cap_env_var == "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK" and rules.default_cap == 4096
    assert rules.local_batch_cap and rules.eager_prefill_dispatched
