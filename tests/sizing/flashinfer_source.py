"""Compile FlashInfer's own layout code, cut from the installed package's C++ sources, for the host.

Without a GPU FlashInfer's size functions cannot run (they JIT-build a CUDA module). Its layout
arithmetic is plain host C++, though: this cuts the layout functions and the constants they use out
of ``flashinfer/data/csrc`` and its headers (verbatim; only the TVM check macros are replaced) and
builds a tiny program with the host C++ compiler. The tests compare capwatch against its output.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

CHECK_MACROS = r"""
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>
struct CheckFailure {
  ~CheckFailure() { std::printf("CHECK_FAILED\n"); std::fflush(stdout); std::exit(3); }
  template <class T> CheckFailure& operator<<(T const&) { return *this; }
};
#define TVM_FFI_ICHECK(cond) if (cond) {} else CheckFailure()
#define TVM_FFI_ICHECK_EQ(a, b) TVM_FFI_ICHECK((a) == (b))
#define TVM_FFI_LOG_AND_THROW(kind) CheckFailure()
"""


class SourceNotFound(Exception):
    pass


def _read(path: Path) -> str:
    if not path.is_file():
        raise SourceNotFound(f"{path} is missing")
    return path.read_text()


def _block(text: str, start: str) -> str:
    """The declaration matching ``start`` through its closing brace (and ``;`` if one follows)."""
    match = re.search(start, text, re.M)
    if not match:
        raise SourceNotFound(f"no declaration matching {start!r}")
    depth, index = 0, text.index("{", match.start())
    while True:
        char = text[index]
        depth += char == "{"
        depth -= char == "}"
        index += 1
        if depth == 0:
            break
    tail = re.match(r"\s*;", text[index:])
    return text[match.start(): index + (tail.end() if tail else 0)]


def _line(text: str, pattern: str) -> str:
    match = re.search(rf"^[^\n]*{pattern}[^\n]*;", text, re.M)
    if not match:
        raise SourceNotFound(f"no line matching {pattern!r}")
    return match.group(0)


def package_dir() -> Path | None:
    """The installed flashinfer package, found without importing it (that takes seconds)."""
    spec = importlib.util.find_spec("flashinfer")
    return Path(spec.origin).parent if spec and spec.origin else None


def package_version(package: Path) -> str:
    return re.search(r"__version__\s*=\s*[\"']([^\"']+)", _read(package / "_build_meta.py")).group(1)


def packages_under_test() -> list[Path]:
    """The installed package, the releases the SGLang tests unpacked (``.sglang-releases/flashinfer-python==*``:
    0.7.4's among them, which cannot share the main venv), plus unpacked wheels named in
    CAPWATCH_FLASHINFER_PACKAGES (paths of their ``flashinfer/`` folders, separated by ``os.pathsep``)."""
    from tests.support.checkout import REPO_ROOT

    unpacked = sorted((REPO_ROOT / ".sglang-releases").glob("flashinfer-python==*/flashinfer"))
    found = [package_dir(), *unpacked] + [Path(p) for p in os.environ.get("CAPWATCH_FLASHINFER_PACKAGES", "").split(os.pathsep) if p]
    return [p for p in dict.fromkeys(found) if p is not None and (p / "_build_meta.py").is_file()]


def python_definitions(path: Path, names: list[str], namespace: dict) -> dict:
    """Execute FlashInfer's own top-level definitions (``name`` or ``Class.method``) from its source
    file, decorators dropped, in ``namespace`` - its Python arithmetic without importing the package."""
    tree = ast.parse(_read(path))
    nodes = []
    for name in names:
        owner, _, member = name.rpartition(".")
        scope = tree.body
        if owner:
            scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == member:
                node.decorator_list = []
                nodes.append(node)
                break
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == member for t in targets):
                    nodes.append(node)
                    break
        else:
            raise SourceNotFound(f"{name} not found in {path}")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def _compile(source: str, workdir: Path, name: str) -> Path:
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        raise SourceNotFound("no host C++ compiler")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{name}.cpp").write_text(source)
    binary = workdir / name
    subprocess.run([compiler, "-std=c++17", "-O1", "-o", str(binary), str(workdir / f"{name}.cpp")],
                   check=True, capture_output=True, text=True, timeout=120)
    return binary


def _run(binary: Path, rows: list[tuple[int, ...]]) -> list[list[int] | None]:
    """One process per row batch; a row FlashInfer's checks reject comes back as None."""
    results: list[list[int] | None] = []
    for row in rows:  # the check macro exits, so rows that may fail run one by one
        out = subprocess.run([str(binary)], input=" ".join(map(str, row)) + "\n",
                             capture_output=True, text=True, timeout=30).stdout.split()
        results.append(None if not out or out[0] == "CHECK_FAILED" else [int(v) for v in out])
    return results


def _run_batch(binary: Path, rows: list[tuple[int, ...]]) -> list[list[int]]:
    text = "".join(" ".join(map(str, row)) + "\n" for row in rows)
    out = subprocess.run([str(binary)], input=text, capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(rows), out.stdout[-500:]
    return [[int(v) for v in line.split()] for line in lines]


class MoeA2AOffsets:
    """``calculateOffsets`` of ``csrc/trtllm_moe_alltoall.cu`` (flashinfer 0.6.0 - 0.7.2.post1)."""

    def __init__(self, package: Path, workdir: Path):
        csrc = package / "data" / "csrc"
        unit = _read(csrc / "trtllm_moe_alltoall.cu")
        meta = _read(csrc / "nv_internal/tensorrt_llm/thop/moeAlltoAllMeta.h")
        kernels = _read(csrc / "nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.h")
        self.source_file = csrc / "trtllm_moe_alltoall.cu"
        calculate = _block(unit, r"^\S.*calculateOffsets\(")
        self.takes_eplb = "eplbStatsNumExperts" in calculate.split("{", 1)[0]
        self.max_top_k = int(re.search(r"kMaxTopK\s*=\s*(\d+)", kernels).group(1))
        call = "calculateOffsets(ep, tokens, eplb)" if self.takes_eplb else "calculateOffsets(ep, tokens)"
        source = "\n".join([
            CHECK_MACROS,
            "namespace fi_throughput {", _block(meta, r"^\s*enum MoeA2AMetaInfoIndex"),
            _line(meta, r"using MoeA2ADataOffsets"), "}",
            "namespace tl_throughput {", _line(kernels, r"kMaxTopK\s*="), "}",
            _line(unit, r"constexpr size_t kCachelineAlignment"),
            _line(unit, r"constexpr size_t kInt32Bytes"),
            _block(unit, r"^inline size_t alignOffset"),
            calculate,
            "int main() { long long ep, tokens, eplb;",
            "  while (std::cin >> ep >> tokens >> eplb) {",
            f"    auto offsets = {call};",
            "    for (auto value : offsets) std::printf(\"%lld \", (long long)value);",
            "    std::printf(\"\\n\"); } }",
        ])
        self.binary = _compile(source, workdir, "moe_a2a_offsets")

    def metainfo(self, rows: list[tuple[int, int, int]]) -> list[list[int]]:
        """(ep_size, max_num_tokens, eplb_stats_num_experts) -> the 10 metainfo offsets."""
        return _run_batch(self.binary, rows)


LAYOUT_FIELDS = (
    "FLAG_VAL_OFFSET_INDEX", "LOCAL_TOKEN_COUNTER_OFFSET_INDEX", "SEND_COUNTERS_OFFSET_INDEX",
    "RECV_COUNTERS_OFFSET_INDEX", "DISPATCH_COMPLETION_FLAGS_OFFSET_INDEX",
    "DISPATCH_COUNTED_WRITE_COUNTERS_OFFSET_INDEX", "DISPATCH_COUNTER_BASELINE_OFFSET_INDEX",
    "TOPK_TARGET_RANKS_OFFSET_INDEX", "TOPK_TARGET_INDICES_OFFSET_INDEX", "EPLB_GATHERED_STATS_OFFSET_INDEX",
    "DISPATCH_PAYLOAD_OFFSET_INDEX", "DISPATCH_PAYLOAD_SIZE_INDEX", "COMBINE_COMPLETION_FLAGS_OFFSET_INDEX",
    "COMBINE_COUNTED_WRITE_COUNTERS_OFFSET_INDEX", "COMBINE_COUNTER_BASELINE_OFFSET_INDEX",
    "COMBINE_INPUT_OFFSET_INDEX", "COMBINE_INPUT_SIZE_INDEX", "COMBINE_RECV_OFFSET_INDEX",
    "COMBINE_RECV_SIZE_INDEX", "MAX_NUM_TOKENS_INDEX", "TOP_K_INDEX", "EP_SIZE_INDEX",
    "EPLB_STATS_NUM_EXPERTS_INDEX", "CFT_ENABLED_INDEX", "WORKSPACE_SIZE_INDEX",
    "LAMPORT_MAX_NUM_TOKENS_INDEX", "LAMPORT_PAYLOAD_FORMAT_INDEX", "LAMPORT_HIDDEN_SIZE_INDEX",
    "LAMPORT_STATE_OFFSET_INDEX", "LAMPORT_LANDING_OFFSET_INDEX", "LAMPORT_COMBINE_LANDING_OFFSET_INDEX",
    "LAMPORT_RECV_OFFSET_INDEX", "LAMPORT_RECV_SIZE_INDEX",
)
LAMPORT_FORMAT_IDS = {"BF16": 0, "MXFP8": 1, "FP8_BLOCK128": 2, "NVFP4": 3}


class NVLinkOneSidedLayout:
    """``calculateWorkspaceLayout`` + ``appendLamportRegions`` of ``csrc/nvlink_one_sided_alltoall.cu``
    (flashinfer 0.7.4)."""

    def __init__(self, package: Path, workdir: Path):
        csrc = package / "data" / "csrc"
        unit = _read(csrc / "nvlink_one_sided_alltoall.cu")
        meta = _read(csrc / "nv_internal/tensorrt_llm/thop/moe/communication/moeAlltoAllMeta.h")
        kernels = _read(csrc / "nv_internal/tensorrt_llm/kernels/moe/communication/moeAlltoAllKernels.h")
        lamport = _read(package / "data" / "include" / "flashinfer/comm/moe_alltoall_lamport.cuh")
        self.source_file = csrc / "nvlink_one_sided_alltoall.cu"
        lamport_parts = [
            _line(lamport, r"constexpr int kMaxRanks"), _line(lamport, r"constexpr int kMaxTopK"),
            _line(lamport, r"constexpr int kNumThreads"), _line(lamport, r"constexpr int kMaxTokensPerRank"),
            _block(lamport, r"^\S.*constexpr int topk_row_vectors").replace("__host__ __device__ ", ""),
            _block(lamport, r"^enum PayloadFormat"),
        ]
        source = "\n".join([
            CHECK_MACROS,
            "namespace tensorrt_llm { namespace kernels { namespace moe_comm {",
            *(_line(kernels, rf"{name}\s*=") for name in ("kMaxTopK", "kMaxPayloads", "kMaxRanks",
                                                           "kCftCounterStride")),
            "}}}",
            "namespace tensorrt_llm { namespace torch_ext { namespace moe_comm {",
            _block(meta, r"^enum MoeA2AMetaInfoIndex"), _line(meta, r"using MoeA2AWorkspaceLayout"),
            _line(meta, r"kWorkspaceAlignment\s*="), "}}}",
            "namespace flashinfer { namespace moe_alltoall_lamport {", *lamport_parts, "}}",
            "namespace tl = tensorrt_llm::kernels::moe_comm;",
            "namespace meta = tensorrt_llm::torch_ext::moe_comm;",
            "namespace lamport = flashinfer::moe_alltoall_lamport;",
            _line(unit, r"constexpr size_t kCachelineAlignment"),
            _block(unit, r"^inline size_t alignOffset"),
            _block(unit, r"^meta::MoeA2AWorkspaceLayout calculateWorkspaceLayout"),
            _block(unit, r"^struct LamportRowBytes"),
            _block(unit, r"^LamportRowBytes lamportRowBytes"),
            _line(unit, r"constexpr int64_t kLamportSourceMaskOffset"),
            _block(unit, r"^struct LamportRegionBytes"),
            _block(unit, r"^LamportRegionBytes lamportRegionBytes"),
            _block(unit, r"^void appendLamportRegions"),
            "int main() { long long ep, tokens, topk, dispatch, combineIn, combineRecv, eplb, cft,",
            "  lamportTokens, lamportFormat, hidden;",
            "  while (std::cin >> ep >> tokens >> topk >> dispatch >> combineIn >> combineRecv >> eplb",
            "         >> cft >> lamportTokens >> lamportFormat >> hidden) {",
            "    auto layout = calculateWorkspaceLayout(ep, tokens, topk, dispatch, combineIn, combineRecv,",
            "                                           eplb, cft != 0);",
            "    if (lamportTokens > 0) appendLamportRegions(layout, lamportTokens, lamportFormat, hidden);",
            "    for (auto value : layout) std::printf(\"%lld \", (long long)value);",
            "    std::printf(\"\\n\"); } }",
        ])
        self.binary = _compile(source, workdir, "nvlink_one_sided_layout")

    def layouts(self, rows: list[tuple[int, ...]]) -> list[dict[str, int] | None]:
        """Rows of (ep, max_tokens, top_k, dispatch_bytes, combine_input_bytes, combine_recv_bytes,
        eplb, cft, lamport_tokens, lamport_format_id, hidden) -> the metainfo fields by name."""
        return [None if values is None else dict(zip(LAYOUT_FIELDS, values, strict=True))
                for values in _run_batch(self.binary, rows)]


class LamportRowGeometry:
    """``lamportRowBytes``, ``lamportDispatchBlocksPerToken`` and ``lamportBytesPerRow`` of
    ``csrc/nvlink_one_sided_alltoall.cu`` (flashinfer 0.7.4): what ``moe_a2a_lamport_row_bytes`` returns to
    ``_default_lamport_max_tokens``, and the kernel constants that default reads (``layout_constants()``)."""

    def __init__(self, package: Path, workdir: Path):
        unit = _read(package / "data" / "csrc" / "nvlink_one_sided_alltoall.cu")
        lamport = _read(package / "data" / "include" / "flashinfer/comm/moe_alltoall_lamport.cuh")
        self.constants = {name: int(re.search(rf"constexpr int {name}\s*=\s*(\d+)", lamport).group(1))
                          for name in ("kDispatchBlocksPerSM", "kMaxTokensPerRank")}
        source = "\n".join([
            CHECK_MACROS,
            "namespace flashinfer { namespace moe_alltoall_lamport {",
            _line(lamport, r"constexpr int kNumThreads"),
            _block(lamport, r"^\S.*constexpr int topk_row_vectors").replace("__host__ __device__ ", ""),
            _block(lamport, r"^enum PayloadFormat"), "}}",
            "namespace lamport = flashinfer::moe_alltoall_lamport;",
            _block(unit, r"^struct LamportRowBytes"),
            _block(unit, r"^LamportRowBytes lamportRowBytes"),
            _block(unit, r"^int64_t lamportDispatchBlocksPerToken"),
            _block(unit, r"^int64_t lamportBytesPerRow"),
            "int main() { long long format, hidden, topk;",
            "  while (std::cin >> format >> hidden >> topk) {",
            "    auto row = lamportRowBytes(format, hidden);",
            "    std::printf(\"%lld %lld %lld %lld\\n\", (long long)row.payload, (long long)row.scale,",
            "                (long long)lamportDispatchBlocksPerToken(row), (long long)lamportBytesPerRow(topk, row, hidden));",
            "  } }",
        ])
        self.binary = _compile(source, workdir, "lamport_row_geometry")

    def rows(self, rows: list[tuple[int, int, int]]) -> list[list[int]]:
        """(format id, hidden, top_k) -> (hidden bytes, scale bytes, blocks per token, bytes per row)."""
        return _run_batch(self.binary, rows)
