"""A monitoring box installs ``a2a-capwatch[service]`` and never gets torch.

``make test`` builds ``.venv-service``: a clean venv with a regular (non-editable) install of
``.[service]`` and nothing else. These tests run its ``capwatch`` console script, from outside the
checkout, as an operator would.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from capwatch.demo.service import ServiceProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_VENV = REPO_ROOT / ".venv-service"
CAPWATCH = SERVICE_VENV / "bin" / "capwatch"

pytestmark = pytest.mark.skipif(
    not CAPWATCH.exists() and not os.environ.get("CAPWATCH_REQUIRE_SERVICE_VENV"),
    reason="no .venv-service (make test builds it)",
)


def _run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(CAPWATCH), *args], cwd="/", capture_output=True, text=True, timeout=timeout_s,
                          env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")})


def test_the_service_venv_has_no_torch():
    probe = subprocess.run([str(SERVICE_VENV / "bin" / "python"), "-c", "import torch"], cwd="/",
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr


def test_plan_prices_a_cap_without_torch():
    completed = _run("plan", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--json")
    assert completed.returncode == 0, completed.stderr
    payload = json.loads(completed.stdout)
    plan = payload[0] if isinstance(payload, list) else payload
    assert plan["workspace_bytes_per_rank"] == 235_585_920  # reference/flashinfer-a2a.md's worked value


def test_serve_answers_without_torch(tmp_path):
    service = ServiceProcess(tmp_path / "capwatch.db", env={"PATH": "/usr/bin:/bin"}, inherit_env=False,
                             python=SERVICE_VENV / "bin" / "python", cwd="/")
    with service.start(timeout_s=60):
        with urllib.request.urlopen(f"{service.url}/v1/clusters", timeout=10) as response:
            assert response.status == 200
            assert json.load(response) is not None
