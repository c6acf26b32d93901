"""``capwatch advise`` against a real ``capwatch serve``; usage errors exit 2 without a traceback."""

from __future__ import annotations

import json
import subprocess
import time

import httpx

from tests.service.conftest import JSON
from tests.support.launcher import run_capwatch
from tests.support.service import ServiceProcess, free_port
from tests.support.simulate import SimulatedRank


def capwatch(*args: str) -> subprocess.CompletedProcess:
    return run_capwatch(*args, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}, inherit_env=False, timeout_s=60)


def test_advise_table_json_and_errors(tmp_path):
    with ServiceProcess(tmp_path / "capwatch.db") as server, httpx.Client(base_url=server.url, headers=JSON) as client:
        ranks = [SimulatedRank("cli", rank, 2, cap=256) for rank in range(2)]
        start = time.time() - 3600
        for window in range(30):
            for rank in ranks:
                body = rank.report(start + 60 * window, start + 60 * window + 59, [150, 300 if window == 9 else 200])
                assert client.post("/v1/reports", content=json.dumps(body)).status_code == 202
        table = capwatch("advise", "--url", server.url)
        assert table.returncode == 0, table.stderr
        assert "cli" in table.stdout and "raise" in table.stdout
        assert "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK=512" in table.stdout  # bump 300 x 1.2, margin 15 %, aligned
        as_json = capwatch("advise", "--url", server.url, "--cluster", "cli", "--json")
        advice = json.loads(as_json.stdout)
        assert advice["action"] == "raise" and advice["recommended_cap"] == 512 and advice["current_cap"] == 256
        unknown = capwatch("advise", "--url", server.url, "--cluster", "nope")
        assert unknown.returncode == 2 and "known clusters: cli" in unknown.stderr and "Traceback" not in unknown.stderr
    down = capwatch("advise", "--url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2 and "cannot reach the capwatch service" in down.stderr
    assert "Traceback" not in down.stderr
    bad_port = capwatch("serve", "--port", "99999")
    assert bad_port.returncode == 2 and "port" in bad_port.stderr
