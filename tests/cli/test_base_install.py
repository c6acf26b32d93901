"""The base install (``pip install a2a-capwatch``, no extras): what it runs, and what it says of what it cannot
(issue #31, symptom 8: ``serve`` and ``demo`` ended in a ``ModuleNotFoundError: httptools`` traceback, the demo
after creating its state folder)."""

from __future__ import annotations

import json

import pytest

from tests.support import launcher
from tests.support.base_install import build_base_venv
from tests.support.service import needs_service_venv, require_current_install

pytestmark = needs_service_venv


@pytest.fixture(scope="module")
def base_python(tmp_path_factory):
    require_current_install()
    return build_base_venv(tmp_path_factory.mktemp("base-venv") / "venv")


def capwatch(python, *args: str, cwd=None, **options):
    return launcher.run("-m", "capwatch", *args, python=python, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
                        inherit_env=False, cwd=cwd, timeout_s=120, **options)


def test_the_base_venv_has_no_extra(base_python, tmp_path):
    probe = launcher.run("-c", "import fastapi", python=base_python, timeout_s=60, cwd=tmp_path)
    assert probe.returncode != 0 and "No module named 'fastapi'" in probe.stderr
    plan = capwatch(base_python, "plan", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--json",
                    cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr


@pytest.mark.parametrize("command, extra", [(["serve"], "service"), (["demo", "--state-dir", "state"], "demo")])
def test_a_missing_extra_is_one_line_naming_the_install_before_anything_is_written(base_python, tmp_path, command,
                                                                                   extra):
    result = capwatch(base_python, *command, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"pip install 'a2a-capwatch[{extra}]'" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == [], "wrote before failing"
    assert result.stdout == ""


def test_version_in_the_base_install(base_python, tmp_path):
    result = capwatch(base_python, "--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("capwatch "), result.stderr
    shown = result.stdout.split()[1]
    metadata = launcher.run("-c", "import importlib.metadata as m; print(m.version('a2a-capwatch'))",
                            python=base_python, timeout_s=60, cwd=tmp_path)
    assert shown == metadata.stdout.strip() and shown != "0+unknown"
    assert json.dumps(shown)
