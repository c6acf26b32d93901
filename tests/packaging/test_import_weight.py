"""The service and the planner never use a tensor: importing them must not load torch (2-3 s and
~300 MB per process). Only the rank side (dispatcher counters, backends) needs it."""

from __future__ import annotations

import pytest

from tests.support import launcher


@pytest.mark.parametrize("module", ["capwatch.telemetry.report", "capwatch.service.main", "capwatch.commands.plan", "capwatch.cli"])
def test_module_imports_without_torch(module):
    probe = f"import sys, {module}; print('torch' in sys.modules)"
    result = launcher.run("-c", probe, env={"PATH": "/usr/bin:/bin"}, inherit_env=False, timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", f"importing {module} loads torch"
