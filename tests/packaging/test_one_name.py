"""No product module has a second name in the test run: only ``capwatch.X``, as in an install.

The pytest process and every child that imports ``tests.*`` (a rank program, a multiprocessing rank, a benchmark)
carry the one-name guard (``tests/support/one_name.py``): importing a product folder by its folder name fails
there. Every other child starts through ``tests.support.launcher``, which leaves the checkout off its path, so the
folder names do not exist for it at all. Each of the three is shown below in a real process; a last test keeps
every test and benchmark starting its children through the launcher.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import multiprocessing
import sys
import types
from pathlib import Path

import capwatch.service.main  # noqa: F401  (the product, loaded here under its one name)
import pytest

from tests.support import launcher, one_name
from tests.support.checkout import PRODUCT_FOLDERS, REPO_ROOT

FOLDER_NAMES = sorted(folder for folder, package in PRODUCT_FOLDERS.items() if package != "capwatch")


def test_the_product_folders_are_what_pyproject_maps():
    assert {"service", "dispatcher", "telemetry", "dashboards", "sglang_plugin", "sizing", "sglang_logs"} <= \
        set(FOLDER_NAMES)
    assert all(PRODUCT_FOLDERS[folder] == f"capwatch.{folder}" for folder in FOLDER_NAMES)


@pytest.mark.parametrize("folder", FOLDER_NAMES)
def test_a_product_folder_cannot_be_imported_by_its_folder_name_in_the_test_process(folder, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # where the folder is found: only the guard stands in the way
    assert importlib.util.find_spec(f"capwatch.{folder}") is not None
    with pytest.raises(ModuleNotFoundError, match=rf"No module named '{folder}': it is capwatch\.{folder}"):
        importlib.import_module(folder)
    assert folder not in sys.modules


def test_nothing_in_this_process_has_a_second_name():
    assert one_name.installed()
    assert one_name.second_names(sys.modules) == {}
    assert "capwatch.service" in sys.modules  # the product is loaded here, under its one name


def test_a_loaded_module_is_found_under_its_second_name():
    def module(name: str, path: Path) -> types.ModuleType:
        loaded = types.ModuleType(name)
        loaded.__file__ = str(path)
        return loaded

    modules = {
        "service.api": module("service.api", REPO_ROOT / "service" / "api" / "__init__.py"),
        "capwatch.service.api": module("capwatch.service.api", REPO_ROOT / "service" / "api" / "__init__.py"),
        "__main__": module("__main__", REPO_ROOT / "capwatch" / "__main__.py"),  # python -m capwatch
        "rank_program": module("rank_program", REPO_ROOT / "tests" / "sglang" / "rank_program.py"),
        "json": json,
    }
    assert one_name.second_names(modules) == {"service.api": "capwatch.service.api",
                                              "rank_program": "tests.sglang.rank_program"}


def test_a_child_without_tests_has_no_checkout_on_its_path():
    probe = ("import importlib.util, json, sys\n"
             "import capwatch.service.api.routes.web\n"
             f"found = [name for name in {FOLDER_NAMES!r} if importlib.util.find_spec(name)]\n"
             "print(json.dumps({'found': found, 'path': sys.path, 'tests': importlib.util.find_spec('tests') is not None}))")
    result = launcher.run("-c", probe, timeout_s=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["found"] == [] and not seen["tests"]
    in_checkout = [entry for entry in seen["path"] if entry in ("", ".") or
                   (Path(entry).resolve().is_relative_to(REPO_ROOT) and ".venv" not in Path(entry).parts)]
    assert in_checkout == [], f"the checkout is on the child's path: {in_checkout}"


@pytest.mark.parametrize("folder", ["service", "dispatcher"])
def test_a_child_that_imports_tests_is_guarded(folder):
    result = launcher.run("-c", f"import tests, importlib; importlib.import_module({folder!r})", imports_tests=True,
                          timeout_s=120)
    assert result.returncode == 1
    assert f"No module named '{folder}': it is capwatch.{folder}" in result.stderr


def test_a_second_name_loaded_before_tests_is_refused_when_tests_is_imported():
    probe = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import sizing; import tests"
    result = launcher.run("-c", probe, imports_tests=True, timeout_s=120)
    assert result.returncode == 1
    assert "imported under a second name before tests.* was: sizing (is capwatch.sizing)" in result.stderr


def _what_a_spawned_child_sees() -> tuple[bool, str]:
    try:
        importlib.import_module("telemetry")
    except ModuleNotFoundError as error:
        return one_name.installed(), str(error)
    return one_name.installed(), "imported"


def test_a_multiprocessing_child_running_test_code_is_guarded():
    """A spawned rank inherits this process's sys.path (the checkout's root on it) and imports its target from
    ``tests.*``: the guard is there before the target runs."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        guarded, outcome = pool.apply(_what_a_spawned_child_sees)
    assert guarded and outcome.startswith("No module named 'telemetry': it is capwatch.telemetry"), outcome


def test_the_launcher_refuses_a_working_folder_in_the_checkout_and_its_own_variables():
    for folder in (REPO_ROOT, REPO_ROOT / "tests", REPO_ROOT / "no-such-folder"):
        with pytest.raises(ValueError, match="outside the checkout"):
            launcher.start("-c", "pass", cwd=folder)
    with pytest.raises(ValueError, match="sets PYTHONPATH itself"):
        launcher.environment({"PYTHONPATH": str(REPO_ROOT)})
    assert launcher.environment({"A": "1"}, inherit=False) == {"A": "1", "PYTHONSAFEPATH": "1"}
    assert launcher.environment(imports_tests=True)["PYTHONPATH"] == str(REPO_ROOT)


def test_a_child_past_its_time_is_killed_and_fails_the_test_with_its_output():
    with pytest.raises(AssertionError, match=r"(?s)ran past 2 s.*stdout:\nstarted"):
        launcher.run("-c", "import time; print('started', flush=True); time.sleep(120)", timeout_s=2)


# What only the launcher may write: a hand-built child would run with the checkout on its path.
CHILD_SETUP_NAMES = {"sys.executable", "PYTHONPATH", "PYTHONSAFEPATH", "capwatch.demo.service"}
LAUNCHERS = {Path("tests/support/launcher.py"), Path("tests/support/service.py"), Path(__file__).relative_to(REPO_ROOT)}


def _child_setup(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            text = f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.ImportFrom):
            text = node.module or ""
        else:
            continue
        found += [f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {name}" for name in CHILD_SETUP_NAMES if name == text]
    return found


def test_tests_and_benchmarks_start_every_child_python_through_the_launcher():
    sources = sorted((REPO_ROOT / "tests").rglob("*.py")) + sorted((REPO_ROOT / "benchmarks").rglob("*.py"))
    assert len(sources) > 50
    found = [place for path in sources if path.relative_to(REPO_ROOT) not in LAUNCHERS for place in _child_setup(path)]
    assert not found, "start child Pythons with tests.support.launcher (or tests.support.service's ServiceProcess):\n" \
        + "\n".join(found)
