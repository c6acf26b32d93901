import pytest
from capwatch.sizing.caps import MAX_CAP_TOKENS, align_up
from capwatch.sizing.checks import SizingError
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.model_presets import MODEL_PRESETS, custom_geometry, model_geometry
from capwatch.sizing.payloads import dispatch_bytes_per_token
from capwatch.sglang_engine.flashinfer import largest_plan_within, plan_workspace
from hypothesis import given, settings
from hypothesis import strategies as st

DEEPSEEK = model_geometry("deepseek-v3")


def test_worked_value_through_the_plan():
    plan = plan_workspace(DEEPSEEK, 8, 1024, "bf16")
    assert (plan.dispatch_bytes_per_token, plan.combine_bytes_per_token) == (14_400, 14_336)
    assert plan.aux_bytes == 180_608
    assert plan.workspace_bytes_per_rank == 235_585_920
    assert plan.workspace_bytes_group == 8 * 235_585_920
    assert plan.expert_rows == 8 * 1024 and plan.max_num_tokens == 1024
    assert plan.flashinfer_version == "0.7.2.post1" and plan.layout == "moe_a2a"
    assert plan.dispatch_region_bytes + plan.combine_region_bytes + plan.aux_bytes == plan.workspace_bytes_per_rank


@pytest.mark.parametrize("payload_format", ["nvfp4", "mxfp8", "fp8", "fp16", "mxfp4", "deepseek-fp8"])
def test_sglang_floors_every_format_at_the_bf16_payload(payload_format):
    flashinfer = plan_workspace(DEEPSEEK, 8, 1024, payload_format)
    sglang = plan_workspace(DEEPSEEK, 8, 1024, payload_format, mode="sglang")
    bf16 = plan_workspace(DEEPSEEK, 8, 1024, "bf16")
    assert sglang.dispatch_bytes_per_token == bf16.dispatch_bytes_per_token == 14_400
    assert sglang.workspace_bytes_per_rank == bf16.workspace_bytes_per_rank
    if payload_format != "fp16":  # quantized: SGLang pays for bytes it never sends
        assert flashinfer.workspace_bytes_per_rank < sglang.workspace_bytes_per_rank


def test_sglang_draft_adds_exactly_128_bytes():
    target = plan_workspace(DEEPSEEK, 8, 4096, "nvfp4", mode="sglang")
    draft = plan_workspace(DEEPSEEK, 8, 4096, "nvfp4", mode="sglang", draft=True)
    assert draft.workspace_bytes_per_rank - target.workspace_bytes_per_rank == 128 == draft.namespace_bytes
    assert draft.workspace_bytes_group - target.workspace_bytes_group == 8 * 128
    assert target.namespace_bytes == 0


@pytest.mark.parametrize("mode", ["flashinfer", "sglang-legacy"])
def test_draft_only_in_sglang_mode(mode):
    with pytest.raises(SizingError, match="--mode sglang"):
        plan_workspace(DEEPSEEK, 8, 1024, mode=mode, draft=True)


@pytest.mark.parametrize("ep_size", [1, 2, 8, 16, 64])
def test_sglang_legacy_passes_cap_times_ep_size(ep_size):
    legacy = plan_workspace(DEEPSEEK, ep_size, 1024, mode="sglang-legacy")
    assert legacy.max_num_tokens == 1024 * ep_size
    assert legacy.expert_rows == ep_size * ep_size * 1024
    # exactly what FlashInfer's formula gives for max_num_tokens = cap * ep_size
    assert legacy.workspace_bytes_per_rank == workspace_bytes_per_rank(ep_size, 1024 * ep_size, 14_400, 14_336)
    fixed = plan_workspace(DEEPSEEK, ep_size, 1024, mode="sglang")
    payload = fixed.dispatch_region_bytes + fixed.combine_region_bytes
    assert legacy.dispatch_region_bytes + legacy.combine_region_bytes == ep_size * payload


def test_sglang_legacy_sized_nvfp4_without_the_floor():
    legacy = plan_workspace(DEEPSEEK, 8, 1024, "nvfp4", mode="sglang-legacy")
    assert legacy.dispatch_bytes_per_token == dispatch_bytes_per_token(7168, 8, "nvfp4") == 4096
    assert plan_workspace(DEEPSEEK, 8, 1024, "mxfp8", mode="sglang-legacy").dispatch_bytes_per_token == 14_400


def test_sglang_modes_need_moe_alltoall():
    with pytest.raises(SizingError, match="removed; pick a version <= 0.7.2.post1"):
        plan_workspace(DEEPSEEK, 8, 1024, flashinfer_version="0.7.4", mode="sglang")


def test_version_0_7_4_plans_nvlink_one_sided():
    plan = plan_workspace(DEEPSEEK, 8, 1024, flashinfer_version="0.7.4")
    assert plan.layout == "nvlink_one_sided" and plan.workspace_bytes_per_rank == 235_472_384
    lamport = plan_workspace(DEEPSEEK, 8, 1024, flashinfer_version="0.7.4", lamport_max_tokens=256)
    assert lamport.workspace_bytes_per_rank == plan.workspace_bytes_per_rank + lamport.lamport_bytes
    with pytest.raises(SizingError, match="only in flashinfer 0.7.4"):
        plan_workspace(DEEPSEEK, 8, 1024, lamport_max_tokens=256)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(ep_size=0), "ep_size must be positive"),
        (dict(ep_size=65), "limit of 64 ranks"),
        (dict(ep_size=512, flashinfer_version="0.7.4"), "limit of 256 ranks"),
        (dict(cap=0), r"cap 0 is outside 1\.\.1048576"),
        (dict(cap=-5), r"cap -5 is outside 1\.\.1048576"),
        (dict(cap=(1 << 20) + 1), r"outside 1\.\.1048576 tokens per rank"),  # the one range (sizing/backends.py)
        (dict(geometry=custom_geometry(4096, 23, 64)), "top_k 23 exceeds .*kMaxTopK of 22"),
        (dict(geometry=custom_geometry(4096, 10, 64), flashinfer_version="0.6.7"), "kMaxTopK of 8"),
        (dict(geometry=custom_geometry(4096, 5, 64), flashinfer_version="0.7.4"), "supports top_k in"),
        (dict(geometry=model_geometry("mixtral-8x7b"), ep_size=16), "num_experts 8 must be >= ep_size 16"),
        (dict(geometry=model_geometry("deepseek-v2"), ep_size=64, flashinfer_version="0.6.15"), "divisible"),
        (dict(eplb_stats_num_experts=256, flashinfer_version="0.6.8"), "no EPLB stats region"),
        (dict(payload_format="int4"), "unknown payload format"),
        (dict(flashinfer_version="0.5.3"), "no MoE A2A"),
        (dict(mode="vllm"), "unknown mode"),
        (dict(geometry=model_geometry("gpt-oss-120b"), payload_format="nvfp4", flashinfer_version="0.7.4",
              lamport_max_tokens=128), "hidden_size % 256"),
        (dict(cap=1 << 30, mode="sglang-legacy"), "outside 1..1048576"),
        (dict(eplb_stats_num_experts=256, mode="sglang"), "no EPLB stats region"),
    ],
)
def test_bad_plans_are_refused(kwargs, message):
    arguments = dict(geometry=DEEPSEEK, ep_size=8, cap=1024)
    with pytest.raises(SizingError, match=message):
        plan_workspace(**{**arguments, **kwargs})


def test_non_divisible_experts_allowed_where_flashinfer_allows_them():
    assert plan_workspace(model_geometry("deepseek-v2"), 64, 1024, flashinfer_version="0.6.16").ep_size == 64


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(MODEL_PRESETS)), st.sampled_from([1, 2, 4, 8]),
    st.integers(1 << 20, 1 << 34), st.sampled_from(["flashinfer", "sglang", "sglang-legacy"]),
    st.sampled_from(["bf16", "nvfp4", "mxfp8"]), st.sampled_from(["0.6.8", "0.7.2.post1", "0.7.4"]),
)
def test_budget_answer_is_the_largest_fitting_aligned_cap(name, ep_size, budget, mode, fmt, version):
    geometry = model_geometry(name)
    if mode != "flashinfer" and version == "0.7.4":
        version = "0.7.2.post1"
    options = dict(geometry=geometry, ep_size=ep_size, payload_format=fmt, flashinfer_version=version, mode=mode)
    try:
        best = largest_plan_within(budget, **options)
    except SizingError as error:
        assert "no cap fits" in str(error)
        assert plan_workspace(cap=128, **options).workspace_bytes_per_rank > budget
        return
    assert best.cap % 128 == 0 and 1 <= best.cap <= MAX_CAP_TOKENS  # never outside the one range
    assert best.workspace_bytes_per_rank <= budget
    if best.cap == MAX_CAP_TOKENS:  # the budget holds more than any cap capwatch sizes
        return
    assert plan_workspace(cap=best.cap + 128, **options).workspace_bytes_per_rank > budget


def test_budget_example_two_gib():
    best = largest_plan_within(2 << 30, DEEPSEEK, 8)
    assert best.cap == 9216 and best.workspace_bytes_per_rank <= 2 << 30
    assert plan_workspace(DEEPSEEK, 8, 9344).workspace_bytes_per_rank > 2 << 30


def test_budget_below_the_smallest_cap_is_an_error():
    with pytest.raises(SizingError, match="no cap fits 1048576 bytes per rank: the smallest aligned cap, 128, "):
        largest_plan_within(1 << 20, DEEPSEEK, 8)


def test_an_alignment_above_the_largest_cap_searched_is_an_error_not_a_cap_above_it():
    with pytest.raises(SizingError, match="the smallest aligned cap, 4096, is above the largest cap searched, 2048"):
        largest_plan_within(64 << 30, DEEPSEEK, 8, alignment=4096, max_cap=2048)
    assert largest_plan_within(64 << 30, DEEPSEEK, 8, alignment=1024, max_cap=2048).cap == 2048


def test_monotone_in_cap_for_every_mode_and_preset():
    for name in MODEL_PRESETS:
        geometry = model_geometry(name)
        for mode in ("flashinfer", "sglang", "sglang-legacy"):
            sizes = [plan_workspace(geometry, 8 if geometry.num_experts >= 8 else 2, cap, mode=mode)
                     .workspace_bytes_per_rank for cap in (128, 129, 1024, 4096)]
            assert sizes == sorted(set(sizes)), (name, mode)
            assert all(size % 128 == 0 for size in sizes)
            assert align_up(sizes[0]) == sizes[0]


def test_the_library_plan_is_flashinfers_own_formula_and_a_callers_allocation_changes_only_what_it_says():
    """sizing's plan_workspace knows no engine: its default allocation is FlashInfer's formula (SGLang's mode
    ``flashinfer``), and a caller's allocation sizes with its own dispatch bytes, tokens and added bytes."""
    from capwatch.sizing import flashinfer_plan

    own = flashinfer_plan.plan_workspace(DEEPSEEK, 8, 1024, "nvfp4")
    assert own == plan_workspace(DEEPSEEK, 8, 1024, "nvfp4", mode="flashinfer")
    caller = flashinfer_plan.Allocation("caller", lambda hidden, top_k, payload_format: 10_000, tokens_for_group=True,
                                        namespace_bytes=64, refusal=lambda version, eplb: "refused" if eplb else None)
    plan = flashinfer_plan.plan_workspace(DEEPSEEK, 8, 128, "nvfp4", allocation=caller)
    assert (plan.mode, plan.max_num_tokens, plan.dispatch_bytes_per_token, plan.namespace_bytes) == (
        "caller", 128 * 8, 10_000, 64)
    with pytest.raises(SizingError, match="^refused$"):
        flashinfer_plan.plan_workspace(DEEPSEEK, 8, 128, eplb_stats_num_experts=8, allocation=caller)

