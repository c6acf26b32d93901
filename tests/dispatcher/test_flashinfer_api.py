"""The FlashInfer adapters against real FlashInfer: the installed package (inspect.signature)
and, when a wheel is at hand, another release's source (ast). No GPU needed. ``MOE_A2A_API`` and
``MOE_EP_API`` below list every class, method and keyword argument the adapters
(``capwatch.dispatcher.flashinfer_backend``) use.

The installed one is flashinfer-python 0.7.2.post1 (both APIs). 0.7.4 cannot share a venv with
it; give its wheel via ``CAPWATCH_FLASHINFER_WHEELS=<dir>`` or ``<repo>/.whl/`` to check it too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import capwatch.dispatcher.flashinfer_backend as adapters
import pytest
from capwatch.dispatcher.flashinfer_backend import (
    LEGACY_METAINFO_INDEX,
    MOE_EP_RUNTIME_TOKENS_KEYWORDS,
    parameter_names,
)
from capwatch.sizing.flashinfer_moe_a2a import workspace_layout

REPO_ROOT = Path(__file__).resolve().parents[2]
# Imports the adapters make only on some versions, and the first version that has them.
VERSION_SPECIFIC_IMPORTS = {("flashinfer.moe_ep.backends.split.comm.nvlink_one_sided.kernels", "layout_constants")}


# --- what the adapters use, declared once -------------------------------------------------------


@dataclass(frozen=True)
class ApiUse:
    """A callable (function, method or dataclass) and the parameters the adapter passes.

    ``parameters`` entries may be alternatives ``"a|b"``: one of them must exist.
    ``attributes``: names read off an instance (checked in the class source).
    """

    module: str  # the public module the adapter imports from
    qualname: str  # "Class", "Class.method" or "function"
    parameters: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()


MOE_A2A_API: tuple[ApiUse, ...] = (
    ApiUse("flashinfer.comm", "Mapping", ("world_size", "rank", "gpus_per_node", "moe_ep_size")),
    ApiUse("flashinfer.comm.mnnvl", "MnnvlConfig", ("comm_backend",)),
    ApiUse("flashinfer.comm.comm_backend", "TorchDistBackend", ("group",)),
    ApiUse("flashinfer.comm", "moe_a2a_get_workspace_size_per_rank",
           ("ep_size", "max_num_tokens", "total_dispatch_payload_size_per_token", "combine_payload_size_per_token")),
    ApiUse("flashinfer.comm", "MoeAlltoAll",
           ("mapping", "max_num_tokens", "top_k", "num_experts", "workspace_size_per_rank", "mnnvl_config"),
           attributes=("workspace", "metainfo", "ep_rank", "ep_size", "max_num_tokens")),
    ApiUse("flashinfer.comm", "MoeAlltoAll.dispatch",
           ("token_selected_experts", "input_payloads", "runtime_max_tokens_per_rank",
            "invalid_token_expert_id", "expert_id_payload_index")),
    ApiUse("flashinfer.comm", "MoeAlltoAll.combine", ("payload", "runtime_max_tokens_per_rank")),
)

MOE_EP_API: tuple[ApiUse, ...] = (
    ApiUse("flashinfer.moe_ep", "BootstrapConfig", ("world_size", "rank", "process_group")),
    ApiUse("flashinfer.moe_ep", "MoEEpCommParams",
           ("num_experts", "top_k", "max_tokens_per_rank", "hidden_size", "dtype", "invalid_expert_id")),
    ApiUse("flashinfer.moe_ep", "NVLinkOneSidedConfig", ()),
    ApiUse("flashinfer.moe_ep", "NVLinkOneSidedAlltoAll", ("bootstrap", "params", "config"),
           attributes=("ep_rank", "ep_size", "params")),
    ApiUse("flashinfer.moe_ep", "NVLinkOneSidedAlltoAll.dispatch",
           ("hidden_states", "topk_ids", "topk_weights", "hidden_states_scale",
            "|".join(MOE_EP_RUNTIME_TOKENS_KEYWORDS))),
    ApiUse("flashinfer.moe_ep", "NVLinkOneSidedAlltoAll.combine", ("expert_output",)),
    ApiUse("flashinfer.moe_ep", "MoEEpDispatchResult",
           ("hidden_states", "topk_ids", "topk_weights", "tokens_per_rank", "hidden_states_scale")),
)


def _resolve(use: ApiUse):
    target = importlib.import_module(use.module)
    for part in use.qualname.split("."):
        target = getattr(target, part)
    return target


def missing_parameters(names: set[str], wanted: Sequence[str]) -> list[str]:
    return [option for option in wanted if not any(alt in names for alt in option.split("|"))]


def check_installed_api(uses: Sequence[ApiUse]) -> list[str]:
    """Problems between ``uses`` and the installed flashinfer (empty when everything matches)."""
    problems = []
    for use in uses:
        where = f"{use.module}.{use.qualname}"
        try:
            target = _resolve(use)
        except (ImportError, AttributeError) as error:
            problems.append(f"{where}: not found ({error})")
            continue
        for name in missing_parameters(parameter_names(target), use.parameters):
            problems.append(f"{where}: no parameter {name!r}")
        if use.attributes:  # set in the class or a flashinfer base class
            source = "".join(inspect.getsource(cls) for cls in target.__mro__ if cls.__module__.startswith("flashinfer"))
            problems += [f"{where}: never sets self.{a}" for a in use.attributes if f"self.{a}" not in source]
    return problems


def installed(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


flashinfer = installed("flashinfer")
needs_flashinfer = pytest.mark.skipif(flashinfer is None, reason="flashinfer-python is not installed")


def adapter_imports() -> set[tuple[str, str]]:
    tree = ast.parse(Path(adapters.__file__).read_text())
    return {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.startswith("flashinfer") for alias in node.names}


# --- the installed package ------------------------------------------------------------------------


@needs_flashinfer
def test_legacy_adapter_matches_installed_moe_alltoall():
    if not hasattr(installed("flashinfer.comm"), "MoeAlltoAll"):
        pytest.skip(f"flashinfer {flashinfer.__version__} has no MoeAlltoAll (removed in 0.7.4)")
    assert check_installed_api(MOE_A2A_API) == []


@needs_flashinfer
def test_moe_ep_adapter_matches_installed_nvlink_one_sided():
    if installed("flashinfer.moe_ep") is None:
        pytest.skip(f"flashinfer {flashinfer.__version__} has no flashinfer.moe_ep (added in 0.7.2)")
    assert check_installed_api(MOE_EP_API) == []


@needs_flashinfer
def test_every_flashinfer_import_of_the_adapters_resolves():
    unresolved = []
    for module, name in sorted(adapter_imports() - VERSION_SPECIFIC_IMPORTS):
        if module.startswith("flashinfer.comm") and not hasattr(installed("flashinfer.comm"), "MoeAlltoAll"):
            continue  # the legacy adapter is unavailable on this version, by design
        if not hasattr(installed(module), name):
            unresolved.append(f"from {module} import {name}")
    assert unresolved == []


@needs_flashinfer
def test_the_checker_notices_a_parameter_that_does_not_exist():
    wrong = ApiUse("flashinfer.comm", "MoeAlltoAll.dispatch", ("token_selected_experts", "no_such_argument"))
    assert check_installed_api([wrong]) == ["flashinfer.comm.MoeAlltoAll.dispatch: no parameter 'no_such_argument'"]


@needs_flashinfer
def test_workspace_counter_indices_match_the_installed_metainfo_header():
    header = Path(flashinfer.__file__).parent / "data/csrc/nv_internal/tensorrt_llm/thop/moeAlltoAllMeta.h"
    if not header.exists():
        pytest.skip("this flashinfer ships no moeAlltoAllMeta.h")
    enum = dict((name, int(value)) for name, value in re.findall(r"(\w+_INDEX)\s*=\s*(\d+)", header.read_text()))
    for name, index in LEGACY_METAINFO_INDEX.items():
        assert enum[name] == index
    # And sizing's metainfo puts the counters at the offsets the views read.
    layout = workspace_layout(ep_size=4, max_num_tokens=64, dispatch_bytes_per_token=1024, combine_bytes_per_token=512)
    assert layout.metainfo[enum["SEND_COUNTERS_OFFSET_INDEX"]] == 8
    assert layout.metainfo[enum["RECV_COUNTERS_OFFSET_INDEX"]] == 8 + 4 * 4


# --- any release's source, read with ast ------------------------------------------------------------


class Release:
    """One flashinfer release's files: an installed or unpacked ``flashinfer/`` folder, or a wheel."""

    def __init__(self, root: Path):
        self.root = root
        self._wheel = zipfile.ZipFile(root) if root.suffix == ".whl" else None
        self.version = re.search(r"__version__\s*=\s*[\"']([^\"']+)", self.read("flashinfer/_build_meta.py")).group(1)

    def read(self, path: str) -> str:
        if self._wheel is not None:
            return self._wheel.read(path).decode()
        return (self.root.parent / path).read_text()

    def has(self, path: str) -> bool:
        if self._wheel is not None:
            return path in self._wheel.namelist()
        return (self.root.parent / path).exists()

    def sources(self) -> dict[str, str]:
        """{path: text} of flashinfer/{comm,moe_ep}/**.py."""
        if self._wheel is not None:
            names = [n for n in self._wheel.namelist() if re.match(r"flashinfer/(comm|moe_ep)/.*\.py$", n)]
        else:
            names = [str(p.relative_to(self.root.parent)) for sub in ("comm", "moe_ep") for p in (self.root / sub).rglob("*.py")]
        return {name: self.read(name) for name in names}


def ast_api_problems(sources: dict[str, str], uses) -> list[str]:
    classes: dict[str, tuple[ast.ClassDef, str]] = {}
    functions: dict[str, ast.FunctionDef] = {}
    # Parse only files that define a name we look for (or a base class): hundreds of files otherwise.
    wanted = {use.qualname.split(".")[0] for use in uses} | {"MoEEpCommunication"}
    definition = re.compile(rf"^(class|def) ({'|'.join(sorted(wanted))})\b", re.MULTILINE)
    for path, text in sources.items():
        if not definition.search(text):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (node, ast.get_source_segment(text, node) or ""))
            elif isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, node)

    def arguments(function) -> set[str]:
        spec = function.args
        return {a.arg for a in spec.posonlyargs + spec.args + spec.kwonlyargs} - {"self"}

    def lineage(name):  # the class and its bases found in the sources
        while name in classes:
            yield classes[name]
            bases = [b.id for b in classes[name][0].bases if isinstance(b, ast.Name)]
            name = bases[0] if bases else None

    def members(node: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        return {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}

    problems = []
    for use in uses:
        where = f"{use.module}.{use.qualname}"
        package_init = sources.get(use.module.replace(".", "/") + "/__init__.py", "")
        head, _, method = use.qualname.partition(".")
        if not re.search(rf"\b{head}\b", package_init) and use.module.replace(".", "/") + ".py" not in sources:
            problems.append(f"{where}: {use.module} does not export {head}")
            continue
        if head in functions and not method:
            names = arguments(functions[head])
        elif head in classes:
            chain = list(lineage(head))
            node = chain[0][0]
            if method:
                found = next((members(c)[method] for c, _ in chain if method in members(c)), None)
                if found is None:
                    problems.append(f"{where}: no method {method}")
                    continue
                names = arguments(found)
            elif "__init__" in members(node):
                names = arguments(members(node)["__init__"])
            else:  # a dataclass: its annotated fields
                names = {item.target.id for item in node.body
                         if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
            source = "".join(text for _, text in chain)
            problems += [f"{where}: never sets self.{a}" for a in use.attributes if f"self.{a}" not in source]
        else:
            problems.append(f"{where}: not defined")
            continue
        problems += [f"{where}: no parameter {name!r}" for name in missing_parameters(names, use.parameters)]
    return problems


@needs_flashinfer
def test_the_ast_checker_agrees_with_inspect_on_the_installed_package():
    sources = Release(Path(flashinfer.__file__).parent).sources()
    assert ast_api_problems(sources, MOE_EP_API) == []
    assert ast_api_problems(sources, MOE_A2A_API) == []
    assert ast_api_problems(sources, [ApiUse("flashinfer.moe_ep", "MoEEpCommParams", ("no_such_field",))]) == [
        "flashinfer.moe_ep.MoEEpCommParams: no parameter 'no_such_field'"
    ]


def other_releases() -> list[Path]:
    """Wheels in $CAPWATCH_FLASHINFER_WHEELS or .whl/, and unpacked ``flashinfer/`` folders in
    $CAPWATCH_FLASHINFER_PACKAGES (os.pathsep-separated, the sizing tests' convention)."""
    folders = [Path(os.environ["CAPWATCH_FLASHINFER_WHEELS"])] if "CAPWATCH_FLASHINFER_WHEELS" in os.environ else []
    folders.append(REPO_ROOT / ".whl")
    found = [wheel for folder in folders for wheel in sorted(folder.glob("flashinfer_python-*.whl"))]
    found += [Path(p) for p in os.environ.get("CAPWATCH_FLASHINFER_PACKAGES", "").split(os.pathsep) if p]
    return found


RELEASES = other_releases()


@pytest.mark.parametrize("root", RELEASES, ids=lambda root: root.name)
def test_adapters_match_another_release(root):
    release = Release(root)
    sources = release.sources()
    has_legacy = "MoeAlltoAll" in sources["flashinfer/comm/__init__.py"]
    has_moe_ep = "flashinfer/moe_ep/__init__.py" in sources
    assert has_legacy or has_moe_ep, f"flashinfer {release.version} has neither A2A API"
    if has_legacy:
        assert ast_api_problems(sources, MOE_A2A_API) == [], release.version
    if has_moe_ep:
        assert ast_api_problems(sources, MOE_EP_API) == [], release.version
    kernels = "flashinfer/moe_ep/backends/split/comm/nvlink_one_sided/kernels.py"
    if kernels in sources:  # the 0.7.4 layout: indices from layout_constants(), recv counters in parity banks
        assert "def layout_constants" in sources[kernels] and 'removeprefix("MOE_A2A_")' in sources[kernels]
        header = release.read("flashinfer/data/csrc/nv_internal/tensorrt_llm/thop/moe/communication/moeAlltoAllMeta.h")
        for name in ("FLAG_VAL_OFFSET_INDEX", "SEND_COUNTERS_OFFSET_INDEX", "RECV_COUNTERS_OFFSET_INDEX"):
            assert f'"MOE_A2A_{name}"' in header
        assert re.search(r"int32_t\[2\]\[ep_size\]: incoming counts by round parity", header)
        communication = sources["flashinfer/moe_ep/backends/split/comm/nvlink_one_sided/communication.py"]
        assert "def alltoall" not in communication  # so the adapter takes the 0.7.4 counter path


def test_required_releases_were_checked():
    """CI names the releases it supplies (CAPWATCH_REQUIRE_FLASHINFER=0.7.4) so a lost wheel fails."""
    required = [v for v in os.environ.get("CAPWATCH_REQUIRE_FLASHINFER", "").split(",") if v]
    if not required:
        pytest.skip("CAPWATCH_REQUIRE_FLASHINFER is not set; releases checked: "
                    + (", ".join(Release(root).version for root in RELEASES) or "the installed one only"))
    checked = {Release(root).version for root in RELEASES}
    assert not set(required) - checked, f"required flashinfer releases not supplied: {set(required) - checked}"
