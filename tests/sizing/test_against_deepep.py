"""capwatch's DeepEP sizing against DeepEP's and SGLang's own code, on CPU.

The released sgl-deep-ep wheels ship DeepEP's compiled extension but no C++ sources, so the check runs the
compiled size functions themselves (``deepep_source.py``: the extension loaded in the sglang venv, a stub
standing in for the GPU driver), reads the wheel's Python config tables and the hidden sizes its kernels
are instantiated for, and runs SGLang 0.5.23's own ``DeepEPBuffer.get_deepep_buffer`` over the wheel's
``Buffer`` (only its constructor, which needs GPUs, records its arguments instead): every preset DeepEP
runs, at caps 64 - 1024, on 8 - 64 ranks, in both modes, with redundant experts and fused shared experts.
``CAPWATCH_DEEPEP_SOURCE`` (a DeepEP checkout) adds the header's arithmetic compiled with g++.

The wheels come from ``make test``'s setup (``.whl/``); without them the module is skipped, unless
``CAPWATCH_REQUIRE_DEEPEP=1`` (``make test``), where that is a failure.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from capwatch.sizing.deepep_low_latency import LOW_LATENCY_HIDDEN_SIZES, low_latency_rdma_bytes
from capwatch.sizing.deepep_normal import (
    COMBINE_CONFIGS,
    DEFAULT_NUM_SMS,
    DISPATCH_CONFIGS,
    NormalConfig,
    nvl_buffer_bytes,
    rdma_buffer_bytes,
)
from capwatch.sglang_engine.deepep import DEEPEP_MODES, plan_deepep_buffer
from capwatch.sizing.model_presets import MODEL_PRESETS

from tests.sglang.ranks import MODEL_CONFIG, sglang_missing, sglang_python
from tests.sglang.releases import release_path
from tests.sizing import deepep_source as source

WHEELS = source.wheels()
if not WHEELS:
    if os.environ.get("CAPWATCH_REQUIRE_DEEPEP") == "1":
        raise RuntimeError(f"CAPWATCH_REQUIRE_DEEPEP=1 but no sgl-deep-ep wheel in {source.WHEEL_DIR} "
                           "(make test downloads them)")
    pytest.skip(f"no sgl-deep-ep wheel in {source.WHEEL_DIR}", allow_module_level=True)

DEEPEP_PRESETS = [geometry for geometry in MODEL_PRESETS.values() if geometry.hidden_size in LOW_LATENCY_HIDDEN_SIZES]
EXPERTS = sorted({geometry.num_experts + extra for geometry in DEEPEP_PRESETS for extra in (0, 8, 32, 64)} | {8, 16})
CAPS = [1, 2, 63, 64, 65, 127, 128, 129, 200, 256, 384, 511, 512, 640, 768, 896, 1000, 1023, 1024]
RANKS = [1, 2, 8, 16, 64]


SGLANG_PINNED = "0.1.2.post1"  # what sglang 0.5.22 - 0.5.23 pin; SGLang's answers come from 0.5.23's release folders
SGLANG_RELEASE = "0.5.23"


def low_latency_rows() -> list[tuple[int, int, int, int]]:
    return list(itertools.product(CAPS, LOW_LATENCY_HIDDEN_SIZES, RANKS, EXPERTS))


def normal_rows() -> list[tuple[int, ...]]:
    return [(num_sms, *tables[ranks], hidden_bytes, ranks)
            for ranks, tables in itertools.product(DISPATCH_CONFIGS, (DISPATCH_CONFIGS, COMBINE_CONFIGS))
            for num_sms, hidden_bytes in itertools.product((2, 20, 24, 132), (4096, 5120, 5760, 14336, 16384))]


def sglang_plans():
    """(plan, NVSHMEM_QP_DEPTH set by the operator or None) for every preset DeepEP runs, caps 64 - 1024, 8 - 64
    ranks, both modes, without and with a redundant expert per rank, without and with fused shared experts."""
    for geometry, ranks, cap, mode, redundant_per_rank, fused in itertools.product(
            DEEPEP_PRESETS, (8, 16, 32, 64), range(64, 1025, 64), DEEPEP_MODES, (0, 1), (0, 1)):
        if geometry.num_experts % ranks or fused and not geometry.shared_experts:
            continue  # experts SGLang cannot spread over these ranks, or none to fuse
        qp_depth = (None, 1536)[cap % 128 == 0]
        yield plan_deepep_buffer(geometry, ranks, cap, mode, redundant_per_rank * ranks,
                                 fused * geometry.shared_experts, qp_depth_environment=qp_depth), qp_depth


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    return source.driver_stub(tmp_path_factory.mktemp("libcuda-stub"))


@pytest.fixture(scope="module")
def python():
    """The sglang venv's python: its CUDA build of torch, NVSHMEM and NCCL are what the extension links against."""
    missing = sglang_missing()
    if missing is not None:
        if os.environ.get("CAPWATCH_REQUIRE_SGLANG_VENV") == "1":
            pytest.fail(f"CAPWATCH_REQUIRE_SGLANG_VENV=1 but {missing}")
        pytest.skip(missing)
    return sglang_python()


@pytest.fixture(scope="module", params=sorted(WHEELS))
def wheel(request, tmp_path_factory):
    """The wheel unpacked, and its compiled code's (and, for the one SGLang pins, SGLang's) answers to every
    query of this module, from one process."""
    version = request.param
    folder = tmp_path_factory.mktemp(f"sgl-deep-ep-{version}")
    return version, source.unpack(WHEELS[version], folder), folder


@pytest.fixture(scope="module")
def answers(wheel, stub, python):
    version, package, folder = wheel
    queries = [["ll", *row] for row in low_latency_rows()]
    queries += [[kind, *row] for row in normal_rows() for kind in ("nvl", "rdma")]
    model = None
    if version == SGLANG_PINNED:
        model = folder / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
        queries += [["sglang", plan.deepep_mode, plan.ep_size, plan.cap, plan.hidden_size, plan.buffer_experts,
                     qp_depth] for plan, qp_depth in sglang_plans()]
    return iter(source.run_extension(python, package, stub, queries, sglang_model=model,
                                     path_first=release_path(SGLANG_RELEASE) if model else []))


def test_the_wheels_sglang_pins_are_here():
    assert set(source.RELEASES) <= set(WHEELS), f"{source.WHEEL_DIR} holds {sorted(WHEELS)}"


def test_hidden_sizes_are_the_compiled_kernels(wheel):
    assert source.compiled_hidden_sizes(wheel[1]) == set(LOW_LATENCY_HIDDEN_SIZES)


def test_normal_mode_tables_are_the_wheels(wheel):
    tables = source.python_buffer_tables(wheel[1])
    assert tables["num_sms"] == DEFAULT_NUM_SMS
    for name, ours in (("get_dispatch_config", DISPATCH_CONFIGS), ("get_combine_config", COMBINE_CONFIGS)):
        assert tables[name] == {ranks: (DEFAULT_NUM_SMS, *row) for ranks, row in ours.items()}, name


# The next three read the answers in the order the fixture asked: keep them in this order.
def test_low_latency_size_matches_the_compiled_hint(answers):
    for (cap, hidden, ranks, experts), theirs in zip(low_latency_rows(), answers):
        assert low_latency_rdma_bytes(cap, hidden, experts) == theirs, (cap, hidden, ranks, experts)


def test_normal_mode_sizes_match_the_compiled_config(answers):
    for num_sms, *config, hidden_bytes, ranks in normal_rows():
        ours = NormalConfig.of(num_sms, *config)
        where = (num_sms, config, hidden_bytes, ranks)
        assert nvl_buffer_bytes(ours, hidden_bytes, ranks) == next(answers), where
        assert rdma_buffer_bytes(ours, hidden_bytes, ranks) == next(answers), where


def test_every_preset_is_priced_as_sglang_allocates_it(wheel, answers):
    """SGLang 0.5.23's own DeepEPBuffer.get_deepep_buffer over the wheel it pins: num_nvl_bytes, num_rdma_bytes
    and NVSHMEM_QP_DEPTH as SGLang sets them, for every plan of ``sglang_plans``."""
    if wheel[0] != SGLANG_PINNED:
        pytest.skip(f"the sglang venv runs sglang 0.5.23, which pins sgl-deep-ep {SGLANG_PINNED}")
    checked = 0
    for plan, _ in sglang_plans():
        nvl, rdma, qp_depth = next(answers)
        where = (plan.model, plan.ep_size, plan.cap, plan.deepep_mode, plan.buffer_experts)
        assert (plan.num_nvl_bytes, plan.num_rdma_bytes, plan.nvshmem_qp_depth) == (nvl, rdma, qp_depth), where
        checked += 1
    assert checked > 1000 and next(answers, None) is None


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    checkout = os.environ.get("CAPWATCH_DEEPEP_SOURCE")
    if not checkout:
        pytest.skip("set CAPWATCH_DEEPEP_SOURCE to a DeepEP checkout to compile its csrc/legacy/config.hpp")
    return source.HeaderLayout(Path(checkout), tmp_path_factory.mktemp("deepep-header"))


def test_low_latency_size_matches_the_header(header):
    rows = list(itertools.product(CAPS, LOW_LATENCY_HIDDEN_SIZES, RANKS, EXPERTS))
    for (cap, hidden, ranks, experts), theirs in zip(rows, header.low_latency_rdma_bytes(rows), strict=True):
        assert low_latency_rdma_bytes(cap, hidden, experts) == theirs, (cap, hidden, ranks, experts)


def test_normal_mode_sizes_match_the_header(header):
    rows = [(DEFAULT_NUM_SMS, *tables[ranks], hidden_bytes, ranks)
            for ranks, tables, hidden_bytes in itertools.product(DISPATCH_CONFIGS, (DISPATCH_CONFIGS, COMBINE_CONFIGS),
                                                                  (4096, 14336))]
    for kind, size in (("nvl", nvl_buffer_bytes), ("rdma", rdma_buffer_bytes)):
        for (num_sms, *config, hidden_bytes, ranks), theirs in zip(rows, header.normal_bytes(kind, rows), strict=True):
            assert size(NormalConfig.of(num_sms, *config), hidden_bytes, ranks) == theirs, (kind, config, ranks)

