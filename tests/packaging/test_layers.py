"""Dependencies point one way, as the README's Architecture section draws them, and that section names every
product folder.

Every ``capwatch.*`` import in the product's code (at module level or inside a function: a lazy import is still
a dependency) goes to a lower layer or stays in its own package. A layer may not reach up: the torch-free sizing
cannot import the service, the dispatcher's hot path cannot import the telemetry that reads it, the service cannot
import the command line.
"""

from __future__ import annotations

import ast
import re
import tomllib

import pytest

from tests.support.checkout import REPO_ROOT

# Lowest first. `capwatch.vocabulary` is the shared words every layer may use, `capwatch.version` the installed
# version every layer may state (the CLI's --version, the build-info metric), `capwatch.series` the shape of a
# backend's or an engine's own series (the engine homes, below the backends, state theirs with it); the rest of
# `capwatch/` is the command line and the demo, on top.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("capwatch.sizing", "capwatch.vocabulary", "capwatch.version", "capwatch.series"),
    ("capwatch.sglang_engine",),  # what SGLang defines (its limits, its floor), torch-free: one home for the engine
    ("capwatch.engines",),  # the engines' registry every layer above reads an engine's facts from
    ("capwatch.backends",),  # one spec per A2A backend over its sizing, and the registry every layer above loops over
    ("capwatch.dispatcher",),
    ("capwatch.telemetry",),
    ("capwatch.agent",),  # the engine-neutral rank agent every engine plugin runs (session, settings, status)
    ("capwatch.dashboards",),
    # The advisor: a library below both of its users, the service and the log reader.
    ("capwatch.advisor",),
    # Three users of the layers below, none of another: the log reader imports nothing of the service.
    ("capwatch.service", "capwatch.sglang_plugin", "capwatch.sglang_logs"),
    ("capwatch",),
)
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]


def package_of(module: str) -> str:
    """The layer entry a ``capwatch.*`` module belongs to (longest match)."""
    names = [name for layer in LAYERS for name in layer if module == name or module.startswith(name + ".")]
    return max(names, key=len)


def rank_of(package: str) -> int:
    return next(index for index, layer in enumerate(LAYERS) if package in layer)


def module_name(path) -> str:
    """The installed name of a product file, through pyproject's package-dir mapping."""
    relative = path.relative_to(REPO_ROOT)
    folder = relative.parts[0]
    package = next(name for name, directory in PACKAGE_DIRS.items() if directory == folder and name.count(".") <= 1)
    parts = [*package.split("."), *relative.with_suffix("").parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_files():
    for folder in sorted(set(PACKAGE_DIRS.values())):
        yield from sorted((REPO_ROOT / folder).rglob("*.py"))


def capwatch_imports(path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("capwatch"):
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            # `from capwatch import vocabulary` names a module; `from capwatch.x import y` names x's.
            target = next((name for name in targets[1:] if _is_module(name)), node.module)
            found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("capwatch")]
    return found


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if len(parts) < 2:
        return False
    top = PACKAGE_DIRS.get(".".join(parts[:2]))
    folder = REPO_ROOT / (top if top else "capwatch")
    rest = parts[2:] if top else parts[1:]
    return (folder.joinpath(*rest).with_suffix(".py")).exists() or (folder.joinpath(*rest) / "__init__.py").exists()


def test_every_import_points_down_or_stays_in_its_package():
    upward = []
    for path in product_files():
        importer = package_of(module_name(path))
        for line, target in capwatch_imports(path):
            imported = package_of(target)
            if imported != importer and rank_of(imported) >= rank_of(importer):
                upward.append(f"{path.relative_to(REPO_ROOT)}:{line} ({importer}) imports {target} ({imported})")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check above can fail: a sizing module importing the advisor, or the advisor importing the service,
    is flagged."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from capwatch.advisor import policy\n    from capwatch.service import config\n")
    (_, advisor), (_, service) = capwatch_imports(bad)
    assert package_of(advisor) == "capwatch.advisor" and rank_of("capwatch.advisor") > rank_of("capwatch.sizing")
    assert package_of(service) == "capwatch.service" and rank_of("capwatch.service") > rank_of("capwatch.advisor")


def test_every_product_package_is_in_a_layer():
    for name in PACKAGE_DIRS:
        assert package_of(name) in {entry for layer in LAYERS for entry in layer}


@pytest.mark.parametrize("folder", sorted({directory for directory in PACKAGE_DIRS.values() if "/" not in directory}))
def test_the_readme_architecture_names_every_product_folder(folder):
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    drawing = section.split("```", 2)[1]
    assert re.search(rf"^{re.escape(folder)}/", drawing, re.M), f"README's Architecture drawing lacks {folder}/"


def _package(module: str, path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def sibling_cycles() -> list[str]:
    """Pairs of sibling packages (one parent) that import each other, directly or through other siblings."""
    edges: dict[str, set[str]] = {}
    for path in product_files():
        importer = _package(module_name(path), path)
        for _, target in capwatch_imports(path):
            imported = target if _is_package(target) else target.rpartition(".")[0]
            if imported != importer and imported.rpartition(".")[0] == importer.rpartition(".")[0]:
                edges.setdefault(importer, set()).add(imported)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            package = todo.pop()
            if package == goal:
                return True
            if package not in seen:
                seen.add(package)
                todo.extend(edges.get(package, ()))
        return False

    pairs = {tuple(sorted((a, b))) for a in edges for b in edges[a] if reaches(b, a)}
    return [f"{a} <-> {b}" for a, b in sorted(pairs)]


def _is_package(name: str) -> bool:
    parts = name.split(".")
    top = PACKAGE_DIRS.get(".".join(parts[:2]))
    folder = REPO_ROOT / (top if top else "capwatch")
    rest = parts[2:] if top else parts[1:]
    return (folder.joinpath(*rest) / "__init__.py").exists()


def test_no_two_sibling_packages_import_each_other():
    """A package cycle (capwatch/demo/session.py once imported commands/advise.py, which the demo command
    imports) makes neither package usable alone; what both need lives below them (capwatch/service_client.py)."""
    assert not sibling_cycles(), "sibling packages that import each other:\n" + "\n".join(sibling_cycles())
