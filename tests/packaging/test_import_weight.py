"""The service and the planner never use a tensor: importing them must not load torch (2-3 s and
~300 MB per process). Only the rank side (dispatcher counters, backends) needs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["capwatch.telemetry.report", "capwatch.service.main", "capwatch.commands.plan", "capwatch.cli"])
def test_module_imports_without_torch(module):
    probe = f"import sys, {module}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", f"importing {module} loads torch"
