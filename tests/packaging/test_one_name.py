"""No product module has a second name in the test run: only ``capwatch.X``, as in an install.

The pytest process and every child that imports ``tests.*`` (a rank program, a multiprocessing rank, a benchmark)
carry the one-name guard (``tests/support/one_name.py``): importing a product folder by its folder name fails
there, as it does in an install.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import multiprocessing
import sys
import types
from pathlib import Path

import capwatch.service.main  # noqa: F401  (the product, loaded here under its one name)
import pytest

from tests.support import one_name
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
