"""On a CUDA machine with flashinfer: capwatch's sizing against FlashInfer's compiled functions."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.flashinfer_one_sided import nvlink_one_sided_layout
from capwatch.sizing.flashinfer_releases import SUPPORTED_FLASHINFER_VERSIONS, FlashInferVersion
from capwatch.sizing.payloads import hidden_bytes_per_token

pytestmark = pytest.mark.gpu
if not any(Path("/dev").glob("nvidia[0-9]*")):  # before importing torch, which takes seconds
    pytest.skip("needs a CUDA device", allow_module_level=True)
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")
VERSION = flashinfer.__version__
if VERSION not in SUPPORTED_FLASHINFER_VERSIONS:
    pytest.skip(f"flashinfer {VERSION} is not a release capwatch sizes", allow_module_level=True)
INFO = FlashInferVersion.parse(VERSION)

GRID = list(itertools.product([1, 2, 4, 8, 16, 64], [1, 127, 128, 1024, 4096, 16384], [2048, 2880, 7168],
                              [2, 8], ["bf16", "nvfp4", "mxfp8"]))


@pytest.mark.skipif(INFO.layout != "moe_a2a", reason="moe_a2a_get_workspace_size_per_rank was removed in 0.7.4")
def test_moe_a2a_get_workspace_size_per_rank_over_a_grid():
    from flashinfer.comm import moe_a2a_get_workspace_size_per_rank

    for ep, tokens, hidden, top_k, fmt in GRID:
        dispatch, combine = hidden_bytes_per_token(hidden, fmt) + 8 * top_k, 2 * hidden
        for stats in ([0, 256] if INFO.supports_eplb_stats else [0]):
            extra = (stats,) if INFO.supports_eplb_stats else ()
            assert workspace_bytes_per_rank(ep, tokens, dispatch, combine, stats, VERSION) == \
                moe_a2a_get_workspace_size_per_rank(ep, tokens, dispatch, combine, *extra), (ep, tokens, hidden, fmt)


@pytest.mark.skipif(INFO.layout != "nvlink_one_sided", reason="only 0.7.4 has moe_a2a_get_workspace_layout")
def test_moe_a2a_get_workspace_layout_over_a_grid():
    from flashinfer.moe_ep.backends.split.comm.nvlink_one_sided.kernels import (
        get_nvlink_one_sided_alltoall_module,
        layout_constants,
    )

    module, index = get_nvlink_one_sided_alltoall_module(), layout_constants()
    for ep, tokens, hidden, top_k, fmt in GRID:
        rows = ep * tokens
        metainfo = torch.empty(index.NUM_METAINFO_FIELDS, dtype=torch.int64)
        module.moe_a2a_get_workspace_layout(
            ep, tokens, top_k, rows * (hidden_bytes_per_token(hidden, fmt) + 8 * top_k) + 4 * 256,
            rows * hidden * 2, 0, 0, False, metainfo)
        ours = nvlink_one_sided_layout(ep, tokens, top_k, hidden, fmt)
        assert ours.workspace_bytes_per_rank == int(metainfo[index.WORKSPACE_SIZE_INDEX]), (ep, tokens, hidden, fmt)
