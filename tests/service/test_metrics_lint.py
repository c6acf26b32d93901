"""The service's own /metrics passes ``promtool check metrics`` (Prometheus' naming lint)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.support.simulate import SimulatedRank
from tests.service.conftest import T0

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (make system-deps)")
def test_service_metrics_pass_promtool(client, clock):
    ranks = [SimulatedRank("lint", rank, 2, cap=256) for rank in range(2)]
    ranks[1].cap = 512  # an active finding, so every family has series
    for window in range(30):
        clock.now = T0 + 60 * window + 60
        for rank in ranks:
            client.post("/v1/reports", content=json.dumps(rank.report(T0 + 60 * window, T0 + 60 * window + 59, [300])))
    client.post("/v1/reports", content=b"{}")
    exposition = client.get("/metrics").text
    assert 'capwatch_consistency_findings{dispatcher="target",ep_group="lint",finding="cap_mismatch"} 1.0' in exposition
    assert 'capwatch_advice_action{action="raise",dispatcher="target",ep_group="lint"} 1.0' in exposition
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
