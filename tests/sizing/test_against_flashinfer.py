"""capwatch's sizing against FlashInfer's own code, on CPU.

FlashInfer's size functions JIT-build a CUDA module, so without a GPU the tests run its code in
pieces: the layout C++ (cut verbatim from the package's csrc and built with the host compiler, see
``flashinfer_source.py``) and its Python arithmetic (executed from its source file). The only thing
replaced is the CUDA module handle, by the compiled C++. The installed flashinfer is always checked;
set CAPWATCH_FLASHINFER_PACKAGES to unpacked wheels' ``flashinfer/`` folders to check more releases.
Skipped cleanly when flashinfer or a C++ compiler is missing.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from capwatch.sizing.checks import SizingError
from capwatch.sizing.flashinfer_moe_a2a import workspace_layout
from capwatch.sizing.flashinfer_one_sided import built_workspace, default_lamport_max_tokens, nvlink_one_sided_layout
from capwatch.sizing.flashinfer_releases import SUPPORTED_FLASHINFER_VERSIONS, FlashInferVersion, lacks_moe_alltoall
from capwatch.sizing.payloads import MOE_EP_QUANT_FORMATS, hidden_bytes_per_token

from tests.sizing import flashinfer_source as source

PACKAGES = source.packages_under_test()
if not PACKAGES:
    pytest.skip("flashinfer is not installed", allow_module_level=True)


def _package_id(package) -> str:
    return source.package_version(package)


@pytest.fixture(scope="module", params=PACKAGES, ids=_package_id)
def package(request):
    version = source.package_version(request.param)
    if version not in SUPPORTED_FLASHINFER_VERSIONS:
        pytest.skip(f"flashinfer {version} is not a release capwatch sizes")
    return request.param


@pytest.fixture(scope="module")
def moe_a2a(package, tmp_path_factory):
    if FlashInferVersion.parse(source.package_version(package)).layout != "moe_a2a":
        pytest.skip("this release has no moe_a2a layout")
    try:
        return source.MoeA2AOffsets(package, tmp_path_factory.mktemp("moe_a2a"))
    except source.SourceNotFound as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="module")
def nvlink(package, tmp_path_factory):
    if FlashInferVersion.parse(source.package_version(package)).layout != "nvlink_one_sided":
        pytest.skip("this release has no NVLinkOneSidedAlltoAll layout")
    try:
        return source.NVLinkOneSidedLayout(package, tmp_path_factory.mktemp("nvlink"))
    except source.SourceNotFound as missing:
        pytest.skip(str(missing))


EP_SIZES = [1, 2, 3, 7, 8, 16, 48, 64]
TOKENS = [1, 7, 31, 32, 33, 127, 128, 1024, 4097, 16384]
EPLB = [0, 1, 33, 256]


def test_moe_alltoall_removal_matches_the_package(package):
    # What the SGLang plugin's "backend unavailable" rests on: the release's flashinfer.comm exports MoeAlltoAll or not.
    exported = "MoeAlltoAll" in (package / "comm" / "__init__.py").read_text()
    assert lacks_moe_alltoall(source.package_version(package)) is not exported


def test_aux_layout_matches_calculate_offsets(package, moe_a2a):
    version = source.package_version(package)
    assert moe_a2a.max_top_k == FlashInferVersion.parse(version).max_top_k
    eplb = EPLB if moe_a2a.takes_eplb else [0]
    assert moe_a2a.takes_eplb == FlashInferVersion.parse(version).supports_eplb_stats
    rows = list(itertools.product(EP_SIZES, TOKENS, eplb))
    for (ep, tokens, stats), offsets in zip(rows, moe_a2a.metainfo(rows), strict=True):
        ours = workspace_layout(ep, tokens, 1, 1, stats, version)
        # Releases before 0.6.16 have no EPLB_GATHERED_STATS entry in their metainfo.
        expected = ours.metainfo if moe_a2a.takes_eplb else ours.metainfo[:8] + ours.metainfo[9:]
        assert expected == offsets, (ep, tokens, stats)
        assert ours.aux_bytes == offsets[-1]


def _flashinfer_size_functions(package, moe_a2a):
    """FlashInfer's Python ``moe_a2a_get_workspace_size_per_rank`` and the ``MoeAlltoAll`` helper,
    their CUDA module replaced by the compiled ``calculateOffsets``."""
    cache: dict[tuple, int] = {}

    def aux_data_size(ep_size, max_num_tokens, eplb_stats_num_experts=0):
        key = (ep_size, max_num_tokens, eplb_stats_num_experts)
        if key not in cache:
            cache[key] = moe_a2a.metainfo([key])[0][-1]
        return cache[key]

    module = SimpleNamespace(moe_a2a_get_aux_data_size=aux_data_size)
    namespace = {"get_moe_alltoall_module": lambda *_, **__: module, "MoeAlltoAllBackend": str}
    return source.python_definitions(
        package / "comm" / "trtllm_moe_alltoall.py",
        ["moe_a2a_get_workspace_size_per_rank", "MoeAlltoAll.get_moe_workspace_size_per_rank"], namespace,
    )


def test_workspace_size_matches_flashinfer_python(package, moe_a2a):
    version = source.package_version(package)
    functions = _flashinfer_size_functions(package, moe_a2a)
    size, helper = functions["moe_a2a_get_workspace_size_per_rank"], functions["get_moe_workspace_size_per_rank"]
    takes_eplb = FlashInferVersion.parse(version).supports_eplb_stats
    for ep, tokens, hidden, top_k, fmt in itertools.product(
        [1, 8, 64], [1, 129, 1024], [2048, 2880, 7168], [2, 8], ["bf16", "nvfp4", "mxfp8", "fp8"]
    ):
        dispatch = hidden_bytes_per_token(hidden, fmt) + 8 * top_k
        stats = 256 if takes_eplb else 0
        expected = size(ep, tokens, dispatch, 2 * hidden, *([stats] if takes_eplb else []))
        assert workspace_layout(ep, tokens, dispatch, 2 * hidden, stats, version).workspace_bytes_per_rank == expected
        # MoeAlltoAll's own helper assumes 16-bit hidden states: our bf16 figure.
        assert helper(ep, top_k, tokens, hidden) == workspace_layout(
            ep, tokens, hidden_bytes_per_token(hidden, "bf16") + 8 * top_k, 2 * hidden, 0, version
        ).workspace_bytes_per_rank


def _moe_ep_table(package):
    path = package / "moe_ep" / "core" / "comm" / "communication.py"
    if not path.is_file():
        pytest.skip("this release has no flashinfer.moe_ep")
    return source.python_definitions(path, ["_ceil_div", "_DISPATCH_BYTES_PER_TOKEN"], {})["_DISPATCH_BYTES_PER_TOKEN"]


@pytest.mark.parametrize("hidden", [2048, 2880, 4096, 5120, 7168])
def test_payload_formats_match_moe_ep_dispatch_bytes_table(package, hidden):
    table = _moe_ep_table(package)
    assert set(table) == set(MOE_EP_QUANT_FORMATS.values())
    for ours, theirs in MOE_EP_QUANT_FORMATS.items():
        assert hidden_bytes_per_token(hidden, ours) == table[theirs](hidden), ours


def _nvlink_row(ep, tokens, top_k, hidden, fmt, eplb, cft, lamport_tokens):
    """Arguments of ``moe_a2a_get_workspace_layout`` as 0.7.4's ``NVLinkOneSidedAlltoAll.__init__``
    computes them (bf16 token dtype, no extra payload bytes), plus the Lamport extension."""
    rows = ep * tokens
    dispatch = rows * (hidden_bytes_per_token(hidden, fmt) + 2 * top_k * 4) + 4 * 256
    combine_input = rows * hidden * 2
    combine_recv = rows * hidden * 2 if cft else 0
    lamport_format = {"bf16": "BF16", "mxfp8": "MXFP8", "deepseek-fp8": "FP8_BLOCK128", "nvfp4": "NVFP4"}[fmt]
    return (ep, tokens, top_k, dispatch, combine_input, combine_recv, eplb, int(cft),
            min(lamport_tokens, 512, tokens), source.LAMPORT_FORMAT_IDS[lamport_format], hidden)


def test_nvlink_one_sided_layout_matches_flashinfer(nvlink):
    cases = [
        case for case in itertools.product(
            [1, 2, 8, 64, 256], [1, 129, 1024], [1, 8, 22], [2048, 7168],
            ["bf16", "nvfp4", "mxfp8", "deepseek-fp8"], [0, 37], [False, True], [0, 159, 512],
        )
        if not (case[7] and case[0] > 64) and not (case[4] == "deepseek-fp8" and case[3] % 512)
    ]
    rows = [_nvlink_row(*case) for case in cases]
    for case, theirs in zip(cases, nvlink.layouts(rows), strict=True):
        ep, tokens, top_k, hidden, fmt, eplb, cft, lamport_tokens = case
        ours = nvlink_one_sided_layout(ep, tokens, top_k, hidden, fmt, eplb, cft=cft,
                                       lamport_max_tokens=lamport_tokens)
        assert (ours.dispatch_payload_offset, ours.dispatch_payload_bytes, ours.combine_completion_flags_offset,
                ours.combine_input_offset, ours.combine_input_bytes, ours.combine_recv_bytes,
                ours.lamport_max_tokens, ours.workspace_bytes_per_rank) == (
            theirs["DISPATCH_PAYLOAD_OFFSET_INDEX"], theirs["DISPATCH_PAYLOAD_SIZE_INDEX"],
            theirs["COMBINE_COMPLETION_FLAGS_OFFSET_INDEX"], theirs["COMBINE_INPUT_OFFSET_INDEX"],
            theirs["COMBINE_INPUT_SIZE_INDEX"], theirs["COMBINE_RECV_SIZE_INDEX"],
            theirs["LAMPORT_MAX_NUM_TOKENS_INDEX"], theirs["WORKSPACE_SIZE_INDEX"]), case


def test_the_built_object_is_read_where_flashinfer_keeps_its_figures(package, nvlink):
    # NVLinkOneSidedAlltoAll.__init__ keeps its layout in self.metainfo (WORKSPACE_SIZE_INDEX after the Lamport
    # extension), its Lamport limit and bytes in self.lamport_max_tokens / self._lamport_workspace_bytes.
    init = (package / "moe_ep/backends/split/comm/nvlink_one_sided/communication.py").read_text()
    for kept in ("self.lamport_max_tokens = max_tokens", "self._lamport_workspace_bytes = (",
                 "int(metainfo[index.WORKSPACE_SIZE_INDEX]) - size_before", 'self.metainfo: "torch.Tensor" = '):
        assert kept in init, kept
    for ep, tokens, cft, lamport_tokens in [(8, 1024, True, 227), (8, 1024, False, 159), (64, 128, True, 0),
                                            (4, 100, False, 512), (2, 33, False, 0)]:
        case = (ep, tokens, 8, 7168, "bf16", 0, cft, lamport_tokens)
        base, = nvlink.layouts([_nvlink_row(*case[:7], 0)])
        theirs, = nvlink.layouts([_nvlink_row(*case)])
        metainfo = [theirs[name] for name in source.LAYOUT_FIELDS]
        clamped = min(lamport_tokens, 512, tokens)
        built = built_workspace(metainfo, {name: i for i, name in enumerate(source.LAYOUT_FIELDS)}, clamped,
                                theirs["WORKSPACE_SIZE_INDEX"] - base["WORKSPACE_SIZE_INDEX"])
        ours = nvlink_one_sided_layout(ep, tokens, 8, 7168, cft=cft, lamport_max_tokens=lamport_tokens)
        assert (built.workspace_bytes_per_rank, built.cft, built.lamport_max_tokens, built.lamport_bytes) == (
            ours.workspace_bytes_per_rank, cft, ours.lamport_max_tokens, ours.lamport_bytes), case
        assert built.sized_offline == (not cft and not clamped)


def test_the_default_lamport_limit_is_flashinfers_for_each_sm_count(package, nvlink, tmp_path):
    # FlashInfer's own _default_lamport_max_tokens (its Python, from its source) over its own row geometry (the
    # compiled C++ moe_a2a_lamport_row_bytes returns), capped by the capacity as __init__ caps it: the limit a run
    # settles on from the SM count every rank votes, which is what no plan can know.
    geometry = source.LamportRowGeometry(package, tmp_path)
    namespace = source.python_definitions(
        package / "moe_ep/backends/split/comm/nvlink_one_sided/communication.py",
        ["_LAMPORT_MIN_DEFAULT_MAX_TOKENS", "_LAMPORT_MAX_DEFAULT_REGION_BYTES", "_default_lamport_max_tokens"],
        {"Any": object})
    index = SimpleNamespace(LAMPORT_DISPATCH_BLOCKS_PER_SM=geometry.constants["kDispatchBlocksPerSM"],
                            LAMPORT_MAX_TOKENS_PER_RANK=geometry.constants["kMaxTokensPerRank"])
    formats = {"bf16": "BF16", "mxfp8": "MXFP8", "deepseek-fp8": "FP8_BLOCK128", "nvfp4": "NVFP4"}
    cases = [case for case in itertools.product(["bf16", "mxfp8", "deepseek-fp8", "nvfp4"], [2048, 4096, 7168],
                                                [1, 8, 22]) if not (case[0] == "deepseek-fp8" and case[1] % 512)]
    rows = geometry.rows([(source.LAMPORT_FORMAT_IDS[formats[fmt]], hidden, top_k) for fmt, hidden, top_k in cases])
    for (fmt, hidden, top_k), row in zip(cases, rows, strict=True):
        row = SimpleNamespace(hidden_bytes=row[0], scale_bytes=row[1], blocks_per_token=row[2], bytes_per_row=row[3])
        for ep, num_sms, capacity in itertools.product([1, 2, 8, 64], [1, 20, 132, 148, 160], [64, 300, 4096]):
            theirs = min(namespace["_default_lamport_max_tokens"](ep, num_sms, row, index), capacity)
            ours = default_lamport_max_tokens(ep, num_sms, top_k, hidden, fmt, capacity)
            assert ours == theirs, (fmt, hidden, top_k, ep, num_sms, capacity)


def test_flashinfer_rejects_what_capwatch_rejects(nvlink):
    # ep_size beyond kMaxRanks and top_k beyond kMaxTopK fail FlashInfer's own checks too.
    assert source._run(nvlink.binary, [_nvlink_row(257, 16, 8, 2048, "bf16", 0, False, 0)]) == [None]
    assert source._run(nvlink.binary, [_nvlink_row(8, 16, 23, 2048, "bf16", 0, False, 0)]) == [None]
    for kwargs in (dict(ep_size=257), dict(top_k=23)):
        with pytest.raises(SizingError):
            nvlink_one_sided_layout(**{**dict(ep_size=8, max_tokens_per_rank=16, top_k=8, hidden_size=2048), **kwargs})
