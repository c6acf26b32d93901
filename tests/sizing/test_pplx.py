"""pplx-kernels' AllToAll as the server builds it, priced from its constructors' allocations (``capwatch.sizing.pplx``).

The figures below are worked by hand from pplx-kernels 2bd6e30's ``csrc/all_to_all/intranode.cpp`` and
``internode.cpp`` for DeepSeek-V3 (H 7168, 256 experts), fp8 dispatch (7168 token bytes, 56 fp32 scales = 224
bytes), one rank per DP group, T = 128: no pplx-kernels runs here to check them against."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.backends import spec_of
from capwatch.backends.pplx import PplxAllToAll, config_of
from capwatch.sizing.checks import SizingError
from capwatch.sizing.pplx import PPLX, PplxConfig, PplxPricing, fp8_scale_bytes, pplx_plan

V3_FP8 = dict(num_experts=256, hidden_size=7168, hidden_dim_bytes=7168, hidden_dim_scale_bytes=224)


def test_deepseek_v3_intranode_by_hand():
    plan = pplx_plan(PplxConfig(world_size=8, dp_size=1, **V3_FP8), 128)
    assert plan.dispatch_bytes_per_token == 7408  # round_up(7168 + 224 + 4, 16)
    # 8 send buffers of max(dispatch, combine): 16 + round_up(32 x 4, 16) + 128 x 32 x round_up(7168 x 4, 16)
    assert plan.token_buffers_bytes == 8 * (16 + 128 + 128 * 32 * 28672) == 939_525_248
    # 3 pointer arrays 8 x 8, receive counts 4 x 128, token counts 4 x 256, per-rank counts 4 x 32 x 8,
    # 6 tracking arrays of 4 x (32 x 128 x 8), the token index
    assert plan.counts_and_tracking_bytes == 192 + 512 + 1024 + 1024 + 6 * 4 * 32768 + 4 == 789_188
    assert plan.symmetric_heap_bytes == 0
    assert plan.all_to_all_bytes == 940_314_436


def test_deepseek_v3_internode_by_hand():
    plan = pplx_plan(PplxConfig(world_size=16, dp_size=1, transport="internode", **V3_FP8), 128)
    batch = 16 * 16 * 128  # local experts x DP groups x T
    # dispatch in T x 7408, out batch x 7408, combine in batch x 4H, out T x E x 4H: all on NVSHMEM's heap
    buffers = 128 * 7408 + batch * 7408 + batch * 28672 + 128 * 256 * 28672
    assert plan.token_buffers_bytes == buffers == 2_122_741_760
    signals = 2 * 8 * 16 * 16 + 8 * 128 + 8 * 16
    assert plan.symmetric_heap_bytes == buffers + signals
    assert plan.counts_and_tracking_bytes == signals + 4 * 16 * 16 + 5 * 4 * batch + 4 == 661_636
    assert plan.all_to_all_bytes == 2_123_403_396


def test_the_intranode_combine_buffer_dominates_so_the_dispatch_dtype_costs_nothing_there():
    bf16 = config_of(8, 7168, 256, PplxAllToAll(transport="intranode", dp_size=1, dispatch_dtype="bf16"))
    fp8 = config_of(8, 7168, 256, PplxAllToAll(transport="intranode", dp_size=1, dispatch_dtype="fp8"))
    assert (bf16.hidden_dim_bytes, bf16.hidden_dim_scale_bytes) == (14336, 0)
    assert (fp8.hidden_dim_bytes, fp8.hidden_dim_scale_bytes) == (7168, fp8_scale_bytes(7168)) == (7168, 224)
    assert pplx_plan(bf16, 256).all_to_all_bytes == pplx_plan(fp8, 256).all_to_all_bytes
    internode = {dtype: pplx_plan(config_of(16, 7168, 256, PplxAllToAll(transport="internode", dp_size=1,
                                                                         dispatch_dtype=dtype)), 256)
                 for dtype in ("bf16", "fp8")}
    assert internode["bf16"].all_to_all_bytes > internode["fp8"].all_to_all_bytes


def test_dp_groups_and_local_experts_round_up_as_pplx_does():
    # 4 ranks of attention TP 2: 2 DP groups; 10 experts on 4 ranks: ceil = 3 local experts
    config = PplxConfig(world_size=4, dp_size=2, num_experts=10, hidden_size=512, hidden_dim_bytes=1024)
    assert (config.dp_groups, config.local_experts) == (2, 3)
    plan = pplx_plan(PplxConfig(world_size=4, dp_size=2, num_experts=10, hidden_size=512, hidden_dim_bytes=1024,
                                transport="internode"), 64)
    assert plan.token_buffers_bytes == 64 * 1040 + 3 * 2 * 64 * 1040 + 3 * 2 * 64 * 2048 + 64 * 10 * 2048


@pytest.mark.parametrize("fields, words", [
    (dict(world_size=8, dp_size=8), "at least 2 DP groups"),  # one DP group: pplx refuses
    (dict(world_size=8, dp_size=3), "at least 2 DP groups"),  # not dividing the group
    (dict(hidden_dim_bytes=7000), "multiple of 16"),  # PPLX_ASSERT traps
    (dict(hidden_dim_scale_bytes=8), "multiple of 16"),
    (dict(transport="nvlink"), "unknown pplx transport"),
])
def test_what_pplx_refuses_is_refused_in_words(fields, words):
    base = dict(world_size=8, dp_size=1, num_experts=256, hidden_size=7168, hidden_dim_bytes=7168,
                hidden_dim_scale_bytes=224)
    with pytest.raises(SizingError, match=words):
        PplxConfig(**{**base, **fields})


def test_an_fp8_dispatch_pplx_would_trap_on_is_refused():
    # H = 7040: 55 scales x 4 = 220 bytes, not a multiple of 16
    with pytest.raises(SizingError, match="hidden_dim_scale_bytes 220"):
        config_of(8, 7040, 256, PplxAllToAll(transport="intranode", dp_size=1))


@given(cap=st.integers(1, 1 << 14), world=st.sampled_from([2, 4, 8, 16, 32]), experts=st.integers(1, 512),
       internode=st.booleans(), fp8=st.booleans())
def test_the_bytes_grow_with_the_cap_and_the_pricing_is_the_plan(cap, world, experts, internode, fp8):
    config = PplxConfig(world, 1, experts, 4096, 4096 if fp8 else 8192, fp8_scale_bytes(4096) if fp8 else 0,
                        "internode" if internode else "intranode")
    plan, bigger = pplx_plan(config, cap), pplx_plan(config, cap + 1)
    assert 0 < plan.all_to_all_bytes < bigger.all_to_all_bytes
    assert plan.all_to_all_bytes == plan.token_buffers_bytes + plan.counts_and_tracking_bytes
    assert plan.symmetric_heap_bytes <= plan.all_to_all_bytes and (plan.symmetric_heap_bytes > 0) == internode
    assert PplxPricing(world, config).bytes_per_rank(cap) == plan.all_to_all_bytes


def test_an_unknown_all_to_all_prices_nothing():
    pricing = PplxPricing(8, None)
    assert pricing.known_bytes_per_rank(128) is None
    with pytest.raises(SizingError, match="not known"):
        pricing.bytes_per_rank(128)
    with pytest.raises(SizingError):
        PplxPricing(8, PplxConfig(8, 1, 256, 7168, 7168, 224)).bytes_per_rank(PPLX.max_cap_tokens + 1)


def test_the_spec_is_exact_and_names_its_own_variable_and_default():
    spec = spec_of("pplx")
    assert spec.bytes_known == "exact"
    assert (spec.rules.cap_env_var, spec.rules.default_cap) == ("SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128)
    assert spec.rules.local_batch_cap and spec.rules.eager_prefill_dispatched
