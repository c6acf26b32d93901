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
import zipfile
from pathlib import Path

import pytest
from capwatch.service.api.routes.web import ASSETS

from tests.support import launcher
from tests.support.checkout import PACKAGE_DIRS, PRODUCT_FOLDERS, REPO_ROOT, installed_path

# Names a stray top-level import of a repository folder would leave in sys.modules.
REPOSITORY_FOLDERS = tuple(folder for folder, package in PRODUCT_FOLDERS.items() if package != "capwatch")


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
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = _source_copy(work / "source")
    built = launcher.run("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"),
                         str(source), timeout_s=300)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (work / "dist").glob("a2a_capwatch-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel_names(wheel) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


def test_the_wheel_holds_exactly_one_top_level_package(wheel_names):
    top_level = {name.split("/", 1)[0] for name in wheel_names} - {
        name.split("/", 1)[0] for name in wheel_names if name.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"capwatch"}, f"the wheel installs more than the one package capwatch: {sorted(top_level)}"
    assert not any(name.startswith("tests/") for name in wheel_names), "tests must not ship in the wheel"


def test_every_product_module_and_run_time_file_ships(wheel_names):
    product = _product_files()
    modules = {installed_path(name) for name in product if name.endswith(".py")}
    data = {installed_path(name) for name in product
            if name.startswith(("dashboards/grafana/", "dashboards/provisioning/", "dashboards/rules/",
                                "service/web/")) or name == "dashboards/prometheus.yml"}
    assert "capwatch/dashboards/grafana/ep-group-overview.json" in data, "no data files found: proves nothing"
    assert "capwatch/sizing/flashinfer_plan.py" in modules
    missing = sorted((modules | data) - wheel_names)
    assert not missing, f"the wheel lacks product files (list the package in pyproject's packages?): {missing}"
    shipped_modules = {name for name in wheel_names if name.endswith(".py")}
    assert shipped_modules == modules, f"the wheel ships modules that are not product code: " \
                                       f"{sorted(shipped_modules - modules)}"


def test_every_module_imports_from_the_wheel_under_its_one_name_only(wheel, tmp_path):
    """Import every product module from the wheel (unpacked outside the checkout, first on sys.path) in a fresh
    interpreter started as a user's would be: each comes from the wheel, not from the checkout the editable
    install maps; each lives in sys.modules once, under ``capwatch.``; no repository folder got imported as a
    top-level package of its own; the files read at run time read through ``capwatch.`` names."""
    modules = sorted(
        installed_path(name)[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for name in _product_files() if name.endswith(".py") and not name.endswith("__main__.py")
    )
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    probe = (
        "import importlib, importlib.resources, json, sys\n"
        f"sys.path.insert(0, {str(unpacked)!r})\n"
        f"names = {modules!r}\n"
        "failed = {}\n"
        "for name in names:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as error:\n"  # an optional dependency (flashinfer, the dashboards SDK)
        "        failed[name] = str(error)\n"
        "files, elsewhere = {}, []\n"
        "for name, module in list(sys.modules.items()):\n"
        "    path = getattr(module, '__file__', None) or ''\n"
        f"    if path.startswith({str(unpacked) + '/'!r}):\n"
        "        files.setdefault(path, []).append(name)\n"
        "    elif name.split('.')[0] == 'capwatch':\n"
        "        elsewhere.append(f'{name} from {path}')\n"
        "web = importlib.resources.files('capwatch.service').joinpath('web')\n"
        f"assets = {{name: web.joinpath(name).read_text() for name in {ASSETS!r}}}\n"
        "print(json.dumps({'failed': failed, 'modules': sorted(sys.modules), 'elsewhere': elsewhere,\n"
        "                  'twice': {path: names for path, names in files.items() if len(names) > 1},\n"
        "                  'assets': assets}))\n"
    )
    completed = launcher.run("-c", probe, cwd=tmp_path, timeout_s=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # Only genuinely optional imports may fail, never a capwatch module missing from the mapping.
    assert all("capwatch" not in message for message in result["failed"].values()), result["failed"]
    assert len(result["failed"]) < len(modules) / 4, result["failed"]
    assert not result["elsewhere"], f"capwatch modules not loaded from the wheel: {result['elsewhere']}"
    stray = [name for name in result["modules"] if name.split(".")[0] in REPOSITORY_FOLDERS]
    assert not stray, f"repository folders imported as top-level packages: {stray}"
    assert not result["twice"], f"modules loaded twice under two names: {result['twice']}"
    assert result["assets"] == {name: (REPO_ROOT / "service" / "web" / name).read_text() for name in ASSETS}


def test_the_installed_dashboard_generator_writes_only_where_it_is_told(wheel, tmp_path):
    """``python -m capwatch.dashboards.generate`` from the wheel, outside the checkout: its default folder is inside
    the installed package, so writing needs ``--out`` (exit 2, nothing written there); with it, the dashboards are
    written there; ``--check`` reads the shipped JSON and finds it current."""
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    shipped = unpacked / "capwatch" / "dashboards" / "grafana"
    before = {path.name: path.read_bytes() for path in shipped.glob("*.json")}

    def generate(*args: str):
        probe = (f"import runpy, sys\nsys.path.insert(0, {str(unpacked)!r})\n"
                 f"sys.argv = ['generate', *{list(args)!r}]\n"
                 "runpy.run_module('capwatch.dashboards.generate', run_name='__main__')\n")
        return launcher.run("-c", probe, cwd=tmp_path, timeout_s=120)

    refused = generate()
    assert refused.returncode == 2 and "--out DIR is needed" in refused.stderr, refused.stderr[-2000:]
    assert {path.name: path.read_bytes() for path in shipped.glob("*.json")} == before
    written = generate("--out", str(tmp_path / "grafana"))
    assert written.returncode == 0, written.stderr[-2000:]
    assert sorted(path.name for path in (tmp_path / "grafana").glob("*.json")) == sorted(before)
    checked = generate("--check")
    assert checked.returncode == 0, checked.stderr[-2000:]
