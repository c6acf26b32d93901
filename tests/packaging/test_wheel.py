"""The wheel installs one package, ``capwatch``, with everything the product reads at run time.

The repository keeps its folders at the root (``dispatcher/``, ``telemetry/``, ``service/``,
``dashboards/``); ``pyproject.toml`` maps each to a subpackage of ``capwatch``. These tests build
the real wheel and check that mapping from both ends: nothing but ``capwatch`` at the top, every
product module inside it, and every module importable under that one name only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
# Names a stray top-level import of a repository folder would leave in sys.modules.
REPOSITORY_FOLDERS = tuple(folder for package, folder in PACKAGE_DIRS.items() if package != "capwatch")


def _installed_name(repo_path: str) -> str:
    """``service/web/app.js`` -> ``capwatch/service/web/app.js`` (the path inside the wheel)."""
    for package, folder in sorted(PACKAGE_DIRS.items(), key=lambda item: -len(item[1])):
        if repo_path == folder or repo_path.startswith(folder + "/"):
            return package.replace(".", "/") + repo_path[len(folder):]
    raise AssertionError(f"{repo_path} lies in no mapped package folder")


def _tracked(folder: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", folder],
                            cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout.splitlines()
    return [name for name in listed if (REPO_ROOT / name).is_file()]


def _product_files() -> list[str]:
    return [name for folder in PACKAGE_DIRS.values() for name in _tracked(folder)]


def _source_copy(destination: Path) -> Path:
    """The files git would commit, copied: a build in the checkout reuses its stale build/ folder."""
    for name in _tracked("."):
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
    return destination


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    work = tmp_path_factory.mktemp("wheel")
    source = _source_copy(work / "source")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(work / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    [wheel] = (work / "dist").glob("a2a_capwatch-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_the_wheel_holds_exactly_one_top_level_package(wheel_names):
    top_level = {name.split("/", 1)[0] for name in wheel_names} - {
        name.split("/", 1)[0] for name in wheel_names if name.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"capwatch"}, f"the wheel installs more than the one package capwatch: {sorted(top_level)}"
    assert not any(name.startswith("tests/") for name in wheel_names), "tests must not ship in the wheel"


def test_every_product_module_and_run_time_file_ships(wheel_names):
    product = _product_files()
    modules = {_installed_name(name) for name in product if name.endswith(".py")}
    data = {_installed_name(name) for name in product
            if name.startswith(("dashboards/grafana/", "dashboards/provisioning/", "dashboards/rules/",
                                "service/web/")) or name == "dashboards/prometheus.yml"}
    assert "capwatch/dashboards/grafana/ep-group-overview.json" in data, "no data files found: proves nothing"
    assert "capwatch/sizing/plan.py" in modules
    missing = sorted((modules | data) - wheel_names)
    assert not missing, f"the wheel lacks product files (list the package in pyproject's packages?): {missing}"
    shipped_modules = {name for name in wheel_names if name.endswith(".py")}
    assert shipped_modules == modules, f"the wheel ships modules that are not product code: " \
                                       f"{sorted(shipped_modules - modules)}"


def test_every_module_imports_under_its_one_name_only():
    """Import every product module in a fresh interpreter (started outside the checkout, as a user's
    would be): each lives in sys.modules once, under ``capwatch.``, and no repository folder got
    imported as a top-level package of its own."""
    modules = sorted(
        _installed_name(name)[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for name in _product_files() if name.endswith(".py") and not name.endswith("__main__.py")
    )
    checkout = f"{REPO_ROOT}/"
    probe = (
        "import importlib, json, sys\n"
        f"names = {modules!r}\n"
        "failed = {}\n"
        "for name in names:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as error:\n"  # an optional dependency (flashinfer, the dashboards SDK)
        "        failed[name] = str(error)\n"
        "files = {}\n"
        "for name, module in list(sys.modules.items()):\n"
        "    path = getattr(module, '__file__', None)\n"
        f"    if path and path.startswith({checkout!r}) and '/.venv/' not in path:\n"
        "        files.setdefault(path, []).append(name)\n"
        "print(json.dumps({'failed': failed, 'modules': sorted(sys.modules),\n"
        "                  'twice': {path: names for path, names in files.items() if len(names) > 1}}))\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # Only genuinely optional imports may fail, never a capwatch module missing from the mapping.
    assert all("capwatch" not in message for message in result["failed"].values()), result["failed"]
    assert len(result["failed"]) < len(modules) / 4, result["failed"]
    stray = [name for name in result["modules"] if name.split(".")[0] in REPOSITORY_FOLDERS]
    assert not stray, f"repository folders imported as top-level packages: {stray}"
    assert not result["twice"], f"modules loaded twice under two names: {result['twice']}"
