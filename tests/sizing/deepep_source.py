"""DeepEP's own sizing code, run on CPU: the released sgl-deep-ep wheels' compiled functions, their Python
config tables, and (given a DeepEP source tree) the header arithmetic compiled with the host C++ compiler.

The wheels SGLang pins (sgl-deep-ep 0.1.2 for 0.5.19 - 0.5.21, 0.1.2.post1 for 0.5.22 - 0.5.23; ``make test``
downloads them into ``.whl/``, as it does flashinfer 0.7.4) ship DeepEP's CUDA extension ``deep_ep/_C`` but no
C++ sources. Its size functions (``get_low_latency_rdma_size_hint``, ``Config.get_nvl_buffer_size_hint`` and
``get_rdma_buffer_size_hint``) are plain host code, so they run here in the sglang venv, whose CUDA build of
torch, NVSHMEM and NCCL the extension links against. The one library a CPU machine lacks is the GPU driver,
``libcuda.so.1``: an empty library of that name, built here, lets the extension load (nothing these functions
do calls the driver). The extension is loaded on its own, not through ``deep_ep/__init__.py``, whose NCCL
check and JIT set-up need a GPU.

``CAPWATCH_DEEPEP_SOURCE`` names a DeepEP checkout (its ``csrc/legacy/config.hpp``, DeepEP 2.x) to compile the
header's ``LowLatencyLayout`` and ``Config`` too.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from tests.sizing.flashinfer_source import SourceNotFound, _block, _compile, _read, _run_batch
from tests.support import launcher
from tests.support.checkout import REPO_ROOT

WHEEL_DIR = REPO_ROOT / ".whl"
# The releases SGLang pins: sgl-deep-ep 0.1.2 (sglang 0.5.19 - 0.5.21) and 0.1.2.post1 (0.5.22 - 0.5.23).
RELEASES = ("0.1.2", "0.1.2.post1")
RUNNER = "tests.sizing.deepep_runner"


def wheels() -> dict[str, Path]:
    """The downloaded sgl-deep-ep wheels by version (``make test``'s setup puts them in ``.whl/``)."""
    found = {}
    for path in sorted(WHEEL_DIR.glob("sgl_deep_ep-*.whl")):
        version = path.name.split("-")[1]
        found[version] = path
    return found


def unpack(wheel: Path, into: Path) -> Path:
    """The wheel's ``deep_ep`` package folder, unpacked under ``into`` (the extension and the Python)."""
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist()
                   if name.startswith("deep_ep/") and (name.endswith(".so") or name.endswith(".py"))]
        archive.extractall(into, members)
    return into / "deep_ep"


def driver_stub(workdir: Path) -> Path:
    """A folder holding an empty ``libcuda.so.1`` (the GPU driver's name), built with the host compiler."""
    compiler = shutil.which("gcc") or shutil.which("cc") or shutil.which("g++")
    if compiler is None:
        raise SourceNotFound("no host C compiler to build the libcuda.so.1 stand-in")
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "empty.c"
    source.write_text("/* stands in for the GPU driver: DeepEP's size functions never call it */\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(workdir / "libcuda.so.1"),
                    str(source)], check=True, capture_output=True, text=True, timeout=120)
    return workdir


def library_path(python: Path, stub: Path) -> str:
    """LD_LIBRARY_PATH for the extension: the stub, then torch's, NVSHMEM's, NCCL's and the CUDA runtime's
    libraries from the venv of ``python``."""
    out = launcher.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", python=python,
                       timeout_s=60)
    site = Path(out.stdout.strip())
    folders = [stub, site / "torch" / "lib", site / "nvidia" / "nvshmem" / "lib", site / "nvidia" / "nccl" / "lib",
               *sorted((site / "nvidia").glob("cu*/lib"))]
    return os.pathsep.join(str(folder) for folder in folders)


def run_extension(python: Path, package: Path, stub: Path, queries: list[list], sglang_model: Path | None = None,
                  path_first: list[Path] = ()) -> list:
    """Answers of the wheel's compiled functions (and of SGLang over them) to ``queries``, in one process of
    ``python`` (see ``deepep_runner.py``); ``path_first``: the SGLang release's folders, where SGLang answers."""
    from tests.sizing.deepep_runner import ANSWERS_MARK

    out = launcher.run("-m", RUNNER, str(package), *([str(sglang_model)] if sglang_model else []), python=python,
                       input=json.dumps(queries), env={"LD_LIBRARY_PATH": library_path(python, stub)},
                       path_first=list(path_first), imports_tests=True, timeout_s=900)
    answers = [line for line in out.stdout.splitlines() if line.startswith(ANSWERS_MARK)]
    if out.returncode != 0 or not answers:
        raise RuntimeError(f"the DeepEP extension did not run (exit {out.returncode}): {out.stderr[-3000:]}")
    return json.loads(answers[-1].removeprefix(ANSWERS_MARK))


def compiled_hidden_sizes(package: Path) -> set[int]:
    """The hidden sizes the wheel's low-latency kernels are instantiated for (``internode_ll::dispatch<...,
    kHidden>`` and ``combine<...>`` template arguments in the extension's symbol names)."""
    data = next(package.glob("_C*.so")).read_bytes()
    found = set()
    for kernel in (rb"internode_ll8dispatchI", rb"internode_ll7combineI"):
        sizes = {int(value) for value in re.findall(kernel + rb"[A-Za-z0-9_]*?ELi(\d{4})E", data)}
        found.add(frozenset(sizes))
    if len(found) != 1:
        raise AssertionError(f"dispatch and combine kernels are compiled for different hidden sizes: {found}")
    return set(found.pop())


def python_buffer_tables(package: Path) -> dict:
    """``Buffer.num_sms`` and the (nvl send, nvl recv, rdma send, rdma recv) tables of
    ``Buffer.get_dispatch_config`` / ``get_combine_config``, executed from ``deep_ep/buffers/legacy.py``."""
    tree = ast.parse(_read(package / "buffers" / "legacy.py"))
    buffer = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Buffer")
    namespace: dict = {}
    tables = {}
    for node in buffer.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "num_sms":
            tables["num_sms"] = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name in ("get_dispatch_config", "get_combine_config"):
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), "legacy.py", "exec"), namespace)  # noqa: S102
    # The functions read Buffer.num_sms and build Config(num_sms, ...): record the arguments.
    namespace["Buffer"] = type("Buffer", (), {"num_sms": tables["num_sms"]})
    namespace["Config"] = lambda *arguments: arguments
    for name in ("get_dispatch_config", "get_combine_config"):
        table = {}
        for ranks in range(1, 257):
            try:
                table[ranks] = namespace[name](ranks)
            except AssertionError:
                continue
        tables[name] = table
    return tables


class HeaderLayout:
    """``LowLatencyLayout`` and ``Config`` of a DeepEP checkout's ``csrc/legacy/config.hpp``, compiled."""

    PRELUDE = r"""
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>
struct nv_bfloat16 { std::uint16_t x; };
struct nv_bfloat162 { nv_bfloat16 x, y; };
struct alignas(16) int4 { int x, y, z, w; };
typedef std::int64_t topk_idx_t;
#define EP_HOST_ASSERT(cond) do { if (!(cond)) { std::printf("CHECK_FAILED\n"); std::exit(3); } } while (0)
#define EP_STATIC_ASSERT(cond, reason) static_assert(cond, reason)
#define __device__
#define __forceinline__ inline
"""

    def __init__(self, checkout: Path, workdir: Path):
        config = _read(checkout / "csrc" / "legacy" / "config.hpp")
        compiled = _read(checkout / "csrc" / "kernels" / "legacy" / "compiled.cuh")
        internode = _read(checkout / "csrc" / "kernels" / "legacy" / "internode.cu")
        defines = re.findall(r"^#define LEGACY_\w+ .*$", compiled, re.M)
        if not defines:
            raise SourceNotFound(f"{checkout} has no LEGACY_ constants in csrc/kernels/legacy/compiled.cuh")
        body = config.split("namespace deep_ep::legacy {", 1)[1].rsplit("}", 1)[0]
        source = "\n".join([
            self.PRELUDE, *defines,
            "namespace deep_ep::legacy { namespace internode {", _block(internode, r"^struct SourceMeta"),
            _block(internode, r"^int get_source_meta_bytes\(\)"), "}", body, "}",
            "using namespace deep_ep::legacy;",
            "int main() { long long kind, a, b, c, d, e, f, g, h;",
            "  while (std::cin >> kind >> a >> b >> c >> d >> e >> f >> g >> h) {",
            "    if (kind == 0) std::printf(\"%lld\\n\", (long long)get_low_latency_rdma_size_hint(a, b, c, d));",
            "    else { Config config(a, b, c, d, e);",
            "      std::printf(\"%lld\\n\", (long long)(kind == 1 ? config.get_nvl_buffer_size_hint(f, g)",
            "                                                  : config.get_rdma_buffer_size_hint(f, g))); } } }",
        ])
        self.binary = _compile(source, workdir, "deepep_layout")

    def low_latency_rdma_bytes(self, rows: list[tuple[int, int, int, int]]) -> list[int]:
        return [values[0] for values in _run_batch(self.binary, [(0, *row, 0, 0, 0, 0) for row in rows])]

    def normal_bytes(self, kind: str, rows: list[tuple[int, ...]]) -> list[int]:
        """Rows of (num_sms, nvl send, nvl recv, rdma send, rdma recv, hidden bytes, ranks); kind nvl or rdma."""
        code = 1 if kind == "nvl" else 2
        return [values[0] for values in _run_batch(self.binary, [(code, *row, 0) for row in rows])]
