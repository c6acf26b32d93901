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
