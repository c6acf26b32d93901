"""The ``telemetry`` extra (what a rank and the SGLang plugin install beside the engine's own torch) is exactly
what their code imports: nothing missing (an ImportError on a rank), nothing extra (a dependency for nothing:
httpx was one, the reporter posts with urllib)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

from capwatch.sglang_plugin import NEEDS

from tests.support.checkout import REPO_ROOT

# What a rank's code reaches: its telemetry and plugin, and the layers below them.
RANK_FOLDERS = ("telemetry", "sglang_plugin", "dispatcher", "sizing")
# The engine's own packages, never installed by capwatch: the server (or the cluster) brings them.
ENGINE_OWN = {"torch", "sglang", "flashinfer"}


def third_party_imports(folders: tuple[str, ...]) -> set[str]:
    found = set()
    for folder in folders:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "capwatch"}


def extra(name: str) -> set[str]:
    """The import names of an extra's own requirements (not the extras it includes)."""
    requirements = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    return {re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].replace("-", "_")
            for requirement in requirements if not requirement.startswith("a2a-capwatch")}


def test_the_telemetry_extra_is_what_the_rank_side_imports():
    assert extra("telemetry") == third_party_imports(RANK_FOLDERS) - ENGINE_OWN


def test_the_plugin_checks_for_what_it_imports():
    """The entry point names what is missing before importing anything (sglang_plugin/__init__.py NEEDS)."""
    assert set(NEEDS) == (third_party_imports(("telemetry", "sglang_plugin")) - {"sglang"})
