"""The FlashInfer workspace formulas: worked value, per-format payloads, versions, properties."""

import pytest
from capwatch.sizing.caps import align_up
from capwatch.sizing.checks import SizingError
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank, workspace_layout
from capwatch.sizing.flashinfer_one_sided import nvlink_one_sided_layout
from capwatch.sizing.flashinfer_releases import (
    DEFAULT_FLASHINFER_VERSION,
    SUPPORTED_FLASHINFER_VERSIONS,
    FlashInferVersion,
)
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token, hidden_bytes_per_token
from hypothesis import given, settings
from hypothesis import strategies as st

LEGACY_VERSIONS = [v for v in SUPPORTED_FLASHINFER_VERSIONS if FlashInferVersion.parse(v).layout == "moe_a2a"]
EPLB_VERSIONS = [v for v in LEGACY_VERSIONS if FlashInferVersion.parse(v).supports_eplb_stats]


def test_worked_value_deepseek_ep8_cap1024_bf16():
    dispatch = dispatch_bytes_per_token(7168, 8, "bf16")
    combine = combine_bytes_per_token(7168)
    layout = workspace_layout(8, 1024, dispatch, combine)
    assert (dispatch, combine) == (14_400, 14_336)
    assert layout.aux_bytes == 180_608
    assert layout.workspace_bytes_per_rank == 235_585_920


def test_default_version_is_the_newest_with_moe_alltoall():
    assert DEFAULT_FLASHINFER_VERSION == "0.7.2.post1"
    assert FlashInferVersion.parse(None).version == DEFAULT_FLASHINFER_VERSION
    assert LEGACY_VERSIONS[-1] == DEFAULT_FLASHINFER_VERSION


@pytest.mark.parametrize(
    ("payload_format", "hidden_bytes"),
    [
        ("bf16", 2 * 7168), ("fp16", 2 * 7168), ("fp8", 7168),
        ("nvfp4", 7168 // 2 + 7168 // 16),  # packed e2m1 + one e4m3 scale per 16
        ("mxfp8", 7168 + 7168 // 32),  # e4m3 + one ue8m0 scale per 32
        ("mxfp4", 7168 // 2 + 7168 // 32),
        ("deepseek-fp8", 7168 + 4 * 56),  # e4m3 + fp32 scale per 128-block
    ],
)
def test_dispatch_bytes_per_format_add_int32_ids_and_fp32_weights(payload_format, hidden_bytes):
    assert hidden_bytes_per_token(7168, payload_format) == hidden_bytes
    assert dispatch_bytes_per_token(7168, 8, payload_format) == hidden_bytes + 8 * (4 + 4)


def test_deepseek_fp8_rounds_partial_scale_blocks_up():
    assert hidden_bytes_per_token(200, "deepseek-fp8") == 200 + 4 * 2


@pytest.mark.parametrize(("payload_format", "hidden_size"), [("nvfp4", 100), ("mxfp8", 2048 + 16), ("mxfp4", 48)])
def test_block_scaled_formats_need_whole_blocks(payload_format, hidden_size):
    with pytest.raises(SizingError, match="multiple of"):
        hidden_bytes_per_token(hidden_size, payload_format)


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(SizingError, match="unknown payload format 'int4'.*bf16.*deepseek-fp8"):
        hidden_bytes_per_token(4096, "int4")


@pytest.mark.parametrize(
    ("version", "max_top_k", "eplb", "divisible"),
    [("0.6.0", 8, False, True), ("0.6.7.post3", 8, False, True), ("0.6.8", 22, False, True),
     ("0.6.15.post1", 22, False, True), ("0.6.16", 22, True, False), ("0.7.2.post1", 22, True, False),
     ("0.7.4", 22, True, True)],
)
def test_version_table(version, max_top_k, eplb, divisible):
    info = FlashInferVersion.parse(version)
    assert (info.max_top_k, info.supports_eplb_stats, info.requires_divisible_experts) == (max_top_k, eplb, divisible)


@pytest.mark.parametrize("version", ["0.5.3", "0.7.3", "1.0.0"])
def test_releases_without_the_a2a_are_refused(version):
    with pytest.raises(SizingError, match=f"flashinfer {version} has no MoE A2A"):
        FlashInferVersion.parse(version)


@pytest.mark.parametrize("version", ["0.7", "latest", "0.7.2-post1", ""])
def test_malformed_versions_are_refused(version):
    with pytest.raises(SizingError):
        FlashInferVersion.parse(version or " ")


def test_version_0_7_4_has_no_moe_a2a_formula():
    with pytest.raises(SizingError, match="removed moe_a2a_get_workspace_size_per_rank"):
        workspace_layout(8, 1024, 14_400, 14_336, flashinfer_version="0.7.4")


def test_eplb_region_refused_before_0_6_16():
    with pytest.raises(SizingError, match="no EPLB stats region"):
        workspace_layout(8, 1024, 14_400, 14_336, eplb_stats_num_experts=256, flashinfer_version="0.6.15")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(ep_size=0), "ep_size must be positive"),
        (dict(ep_size=-4), "ep_size must be positive"),
        (dict(ep_size=65), "limit of 64 ranks"),
        (dict(max_num_tokens=0), "must be positive"),
        (dict(max_num_tokens=1 << 31), "int32"),
        (dict(dispatch_bytes_per_token=0), "dispatch_bytes_per_token must be positive"),
        (dict(eplb_stats_num_experts=-1), "eplb_stats_num_experts must be an integer >= 0|must be >= 0"),
        (dict(ep_size=8.0), "ep_size must be an integer"),
        (dict(ep_size=True), "ep_size must be an integer"),
    ],
)
def test_bad_sizes_are_refused(kwargs, message):
    arguments = dict(ep_size=8, max_num_tokens=1024, dispatch_bytes_per_token=14_400, combine_bytes_per_token=14_336)
    with pytest.raises(SizingError, match=message):
        workspace_layout(**{**arguments, **kwargs})


ep_sizes = st.integers(1, 64)
caps = st.integers(1, 1 << 16)
payload = st.integers(1, 1 << 15)


@settings(max_examples=150, deadline=None)
@given(ep_sizes, caps, payload, payload, st.sampled_from(LEGACY_VERSIONS))
def test_workspace_is_128_aligned_and_regions_add_up(ep_size, cap, dispatch, combine, version):
    layout = workspace_layout(ep_size, cap, dispatch, combine, flashinfer_version=version)
    assert layout.workspace_bytes_per_rank % 128 == 0
    assert all(offset % 128 == 0 for offset in layout.metainfo[4:])  # every region after the counters
    assert layout.workspace_bytes_per_rank == layout.aux_bytes + layout.dispatch_region_bytes \
        + layout.combine_region_bytes
    assert layout.dispatch_region_bytes >= ep_size * cap * dispatch > layout.dispatch_region_bytes - 128


@settings(max_examples=150, deadline=None)
@given(ep_sizes, caps, st.integers(1, 4096), payload, st.sampled_from(LEGACY_VERSIONS))
def test_workspace_is_monotone_in_cap(ep_size, cap, more, dispatch, version):
    smaller = workspace_bytes_per_rank(ep_size, cap, dispatch, 2048, flashinfer_version=version)
    larger = workspace_bytes_per_rank(ep_size, cap + more, dispatch, 2048, flashinfer_version=version)
    assert larger > smaller


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 63), caps, payload, st.sampled_from(LEGACY_VERSIONS))
def test_workspace_is_monotone_in_ep_size(ep_size, cap, dispatch, version):
    smaller = workspace_bytes_per_rank(ep_size, cap, dispatch, 2048, flashinfer_version=version)
    assert workspace_bytes_per_rank(ep_size + 1, cap, dispatch, 2048, flashinfer_version=version) > smaller


@settings(max_examples=150, deadline=None)
@given(ep_sizes, caps, payload, st.integers(1, 1024), st.sampled_from(EPLB_VERSIONS))
def test_eplb_region_adds_exactly_its_aligned_bytes(ep_size, cap, dispatch, stats, version):
    without = workspace_bytes_per_rank(ep_size, cap, dispatch, 2048, 0, version)
    with_stats = workspace_bytes_per_rank(ep_size, cap, dispatch, 2048, stats, version)
    assert with_stats - without == align_up(4 * ep_size * stats)


@settings(max_examples=150, deadline=None)
@given(ep_sizes, caps, payload)
def test_0_6_8_differs_from_0_6_7_by_exactly_the_kmaxtopk_regions(ep_size, cap, dispatch):
    old = workspace_layout(ep_size, cap, dispatch, 2048, flashinfer_version="0.6.7")
    new = workspace_layout(ep_size, cap, dispatch, 2048, flashinfer_version="0.6.8")
    # two int32 regions (target ranks, send indices) of cap * kMaxTopK entries, 8 -> 22
    assert new.workspace_bytes_per_rank - old.workspace_bytes_per_rank == 2 * (align_up(4 * 22 * cap)
                                                                               - align_up(4 * 8 * cap))
    assert new.topk_send_indices_offset - new.topk_target_ranks_offset == align_up(4 * 22 * cap)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 256), caps, st.sampled_from([1, 2, 4, 6, 8, 10, 22]), st.sampled_from([2048, 4096, 7168]))
def test_nvlink_one_sided_is_256_aligned_and_monotone(ep_size, cap, top_k, hidden):
    layout = nvlink_one_sided_layout(ep_size, cap, top_k, hidden)
    assert layout.workspace_bytes_per_rank % 256 == 0
    assert layout.dispatch_payload_offset % 256 == 0 and layout.combine_input_offset % 256 == 0
    assert nvlink_one_sided_layout(ep_size, cap + 1, top_k, hidden).workspace_bytes_per_rank \
        > layout.workspace_bytes_per_rank


def test_nvlink_one_sided_worked_value():
    # flashinfer 0.7.4, DeepSeek-V3 geometry, ep 8, 1024 tokens per rank, bf16, fence path only.
    layout = nvlink_one_sided_layout(8, 1024, 8, 7168)
    assert layout.dispatch_payload_offset == 65_792
    assert layout.dispatch_payload_bytes == 8 * 1024 * 14_400 + 4 * 256
    assert layout.combine_input_bytes == 8 * 1024 * 14_336
    assert layout.workspace_bytes_per_rank == 235_472_384


def test_nvlink_one_sided_cft_and_lamport_only_add_bytes():
    base = nvlink_one_sided_layout(8, 1024, 8, 7168).workspace_bytes_per_rank
    with_cft = nvlink_one_sided_layout(8, 1024, 8, 7168, cft=True)
    assert with_cft.combine_recv_bytes == 8 * 1024 * 7168 * 2
    assert with_cft.workspace_bytes_per_rank > base + with_cft.combine_recv_bytes
    lamport = nvlink_one_sided_layout(8, 1024, 8, 7168, lamport_max_tokens=4096)
    assert lamport.lamport_max_tokens == 512  # kMaxTokensPerRank
    assert lamport.workspace_bytes_per_rank == base + lamport.lamport_bytes > base


def test_lamport_refuses_formats_it_cannot_carry():
    with pytest.raises(SizingError, match="does not carry fp8"):
        nvlink_one_sided_layout(8, 1024, 8, 7168, "fp8", lamport_max_tokens=256)
    with pytest.raises(SizingError, match="hidden_size % 256"):
        nvlink_one_sided_layout(8, 1024, 8, 2880, "nvfp4", lamport_max_tokens=256)
