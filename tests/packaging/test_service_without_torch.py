"""A monitoring box installs ``a2a-capwatch[service]`` and never gets torch.

``make test`` builds ``.venv-service``: a clean venv with a regular (non-editable) install of
``.[service]`` and nothing else. These tests run its ``capwatch`` console script, from outside the
checkout, as an operator would.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.support import launcher
from tests.support.base_install import BASE_CLOSURE
from tests.support.service import (
    INSTALLED_PYTHON,
    SERVICE_VENV,
    ServiceProcess,
    needs_service_venv,
    require_current_install,
)

CAPWATCH = SERVICE_VENV / "bin" / "capwatch"
OPERATOR_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}

pytestmark = needs_service_venv


@pytest.fixture(autouse=True)
def _current_install():
    require_current_install()


def _run(*args: str, timeout_s: float = 60):
    return launcher.run(*args, python=CAPWATCH, env=OPERATOR_ENV, inherit_env=False, timeout_s=timeout_s)


def test_the_service_venv_has_no_torch():
    probe = launcher.run("-c", "import torch", python=INSTALLED_PYTHON, timeout_s=60)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr


def test_plan_prices_a_cap_without_torch():
    completed = _run("plan", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--json")
    assert completed.returncode == 0, completed.stderr
    payload = json.loads(completed.stdout)
    plan = payload[0] if isinstance(payload, list) else payload
    assert plan["workspace_bytes_per_rank"] == 235_585_920  # reference/flashinfer-a2a.md's worked value


def test_serve_answers_without_torch(tmp_path):
    service = ServiceProcess(tmp_path / "capwatch.db", env={"PATH": "/usr/bin:/bin"}, inherit_env=False,
                             python=INSTALLED_PYTHON, cwd=tmp_path)
    with service.start(timeout_s=60):
        with urllib.request.urlopen(f"{service.url}/v1/clusters", timeout=10) as response:
            assert response.status == 200
            assert json.load(response) is not None


# What each command a base install (`pip install a2a-capwatch`, no extras) runs imports, run in the installed
# product: every distribution it loads must be in the base install's dependency closure, or that command fails
# with ModuleNotFoundError on a laptop (it did: `advise --sglang-log` reached pydantic-settings, a [service] extra).
IMPORTED_DISTRIBUTIONS = BASE_CLOSURE + """
import atexit, json, sys

def report():
    owners = metadata.packages_distributions()
    used = {owner.lower().replace("_", "-") for module in list(sys.modules)
            for owner in owners.get(module.split(".")[0], [])} - VENV_TOOLS
    print(json.dumps({"used": sorted(used), "base": sorted(base_closure())}), file=sys.__stderr__)

# This probe's own pip import, and setuptools' distutils shim that every venv's .pth loads.
VENV_TOOLS = {"pip", "setuptools"}
atexit.register(report)
if sys.argv[1] != "-":
    __import__(sys.argv[1])
from capwatch.cli import main
sys.argv = ["capwatch", *sys.argv[2:]]
main()
"""


def _base_command_imports(*args: str, also_import: str = "-") -> tuple[set[str], set[str], object]:
    result = launcher.run("-c", IMPORTED_DISTRIBUTIONS, also_import, *args, python=INSTALLED_PYTHON, env=OPERATOR_ENV,
                          inherit_env=False, timeout_s=120)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return set(report["used"]), set(report["base"]), result


def test_the_base_install_closure_is_read_from_the_installed_metadata():
    """The check below can fail: the service's own imports reach beyond the base closure."""
    used, base, _ = _base_command_imports("plan", "--help", also_import="capwatch.service.main")
    assert {"fastapi", "starlette"} <= used - base


@pytest.mark.parametrize("command", ["plan", "advise --sglang-log"])
def test_a_base_install_command_imports_only_the_base_dependencies(tmp_path, command):
    from tests.sglang_logs.logs import T0, decode_lines, traffic, write
    from tests.support import sglang_logs as sg

    log = sg.FORMAT["sglang-0.5.19+"]
    args = (["plan", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024"] if command == "plan" else
            ["advise", "--json", "--sglang-log", write(tmp_path / "server.log", log.start(T0 - 30) + decode_lines(
                log, traffic(30, lambda minute, second, dp: 40 + dp)))])
    used, base, result = _base_command_imports(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert used - base == set(), f"`capwatch {command}` imports beyond `pip install a2a-capwatch`: {used - base}"


# SGLang's load_plugins(), reduced to what touches the entry point, in a scheduler process (its module loaded).
LOAD_PLUGINS = """
import logging, sys, types
from importlib.metadata import entry_points
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")
sys.modules["sglang.srt.managers.scheduler"] = types.ModuleType("sglang.srt.managers.scheduler")
(plugin,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "capwatch"]
plugin.load()()
print("loaded and ran")
"""


def test_the_sglang_entry_point_is_harmless_without_its_extra():
    """Where the ``sglang`` extra's imports are missing (here torch), loading and calling the entry point raises
    nothing: one line says what to install, and nothing else of capwatch's is imported."""
    completed = launcher.run("-c", LOAD_PLUGINS + "print(sorted(m for m in sys.modules if m.startswith('capwatch.')))",
                             python=INSTALLED_PYTHON, env=OPERATOR_ENV, inherit_env=False, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    assert "loaded and ran" in completed.stdout
    lines = [line for line in completed.stderr.splitlines() if "capwatch:" in line]
    assert len(lines) == 1 and "capwatch: disabled: torch not installed" in lines[0] \
        and "a2a-capwatch[sglang]" in lines[0], completed.stderr
    assert "capwatch.sglang_plugin.plugin" not in completed.stdout and "capwatch.telemetry" not in completed.stdout


def test_the_kill_switch_reads_before_anything_else():
    """``CAPWATCH_ENABLED=0``: the one line says the plugin is off (not that an extra is missing)."""
    completed = launcher.run("-c", LOAD_PLUGINS, python=INSTALLED_PYTHON, env={**OPERATOR_ENV, "CAPWATCH_ENABLED": "0"},
                             inherit_env=False, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    lines = [line for line in completed.stderr.splitlines() if "capwatch:" in line]
    assert len(lines) == 1 and "capwatch: off (CAPWATCH_ENABLED=0)" in lines[0], completed.stderr


def test_dashboards_export_writes_what_the_package_ships(tmp_path):
    """A pip user's copy of the dashboards, rules and manifests: the installed console script writes them, equal to
    the checkout's; Prometheus' own check accepts the exported config with its rules; a second export refuses to
    overwrite (exit 2, one line) and --force does."""
    import shutil
    import subprocess

    from tests.support.checkout import REPO_ROOT

    target = tmp_path / "capwatch-ops"
    completed = _run("dashboards", "export", str(target))
    assert completed.returncode == 0, completed.stderr
    shipped = sorted(path.relative_to(target) for path in target.rglob("*") if path.is_file())
    assert len(shipped) >= 13 and any(path.parts[0] == "kubernetes" for path in shipped)
    for relative in shipped:
        assert (target / relative).read_bytes() == (REPO_ROOT / "dashboards" / relative).read_bytes(), relative
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install the Debian 'prometheus' package (make system-deps)"
    checked = subprocess.run([promtool, "check", "config", str(target / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    again = _run("dashboards", "export", str(target))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "--force" in again.stderr
    assert _run("dashboards", "export", str(target), "--force").returncode == 0
    assert _run("dashboards", "export", str(tmp_path / "editable"), "--editable").returncode == 0
    for path in (tmp_path / "editable" / "grafana").glob("*.json"):
        shipped_json, edited = json.loads((target / "grafana" / path.name).read_text()), json.loads(path.read_text())
        assert shipped_json["editable"] is False and edited == {**shipped_json, "editable": True}
