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


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_one_json_shape_whether_one_cluster_or_many_and_csv(tmp_path):
    """Issue #31, item 6: `advise --json` printed an object for one cluster and a list for several; now one
    object per advice, a line each, whatever the number (--format json, --json its alias); --format csv a row
    each."""
    import csv
    import io

    with ServiceProcess(tmp_path / "capwatch.db") as server, httpx.Client(base_url=server.url, headers=JSON) as client:
        start = time.time() - 3600
        for name in ("alpha", "beta"):
            rank = SimulatedRank(name, 0, 1, cap=256)
            for window in range(25):
                body = rank.report(start + 60 * window, start + 60 * window + 59, [150, 200])
                assert client.post("/v1/reports", content=json.dumps(body)).status_code == 202
        one = capwatch("advise", "--url", server.url, "--cluster", "alpha", "--format", "json")
        many = capwatch("advise", "--url", server.url, "--format", "json")
        alias = capwatch("advise", "--url", server.url, "--json")
        table_csv = capwatch("advise", "--url", server.url, "--format", "csv")
    assert one.returncode == many.returncode == alias.returncode == table_csv.returncode == 0, many.stderr
    [alone] = json_lines(one.stdout)
    both = json_lines(many.stdout)
    assert [advice["cluster"] for advice in both] == ["alpha", "beta"]
    assert (alone["action"], alone["recommended_cap"]) == (both[0]["action"], both[0]["recommended_cap"])
    assert set(alone) == set(both[1]) and [a["cluster"] for a in json_lines(alias.stdout)] == ["alpha", "beta"]
    rows = list(csv.DictReader(io.StringIO(table_csv.stdout)))
    assert [row["cluster"] for row in rows] == ["alpha", "beta"]
    assert rows[0]["action"] == alone["action"] and rows[0]["current_cap"] == str(alone["current_cap"])


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


def test_advise_advises_every_cluster_it_can_and_names_the_others(tmp_path):
    """Issue #20, finding 4: one draft-only report made `capwatch advise` fail for every cluster (exit 2), and
    `--role draft` failed whenever a cluster had no draft ranks. A role a cluster lacks is not an error."""
    with ServiceProcess(tmp_path / "capwatch.db") as server, httpx.Client(base_url=server.url, headers=JSON) as client:
        start = time.time() - 3600
        target = SimulatedRank("prod", 0, 1, cap=256)
        draft_only = SimulatedRank("zz", 0, 1, cap=256, role="draft")
        for window in range(25):
            for rank in (target, draft_only):
                body = rank.report(start + 60 * window, start + 60 * window + 59, [150, 200])
                assert client.post("/v1/reports", content=json.dumps(body)).status_code == 202
        table = capwatch("advise", "--url", server.url)
        assert table.returncode == 0, table.stderr
        assert "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK=" in table.stdout
        assert "zz: no 'target' ranks (roles: draft)" in table.stdout
        drafts = json_lines(capwatch("advise", "--url", server.url, "--role", "draft", "--json").stdout)
        by_cluster = {entry["cluster"]: entry for entry in drafts}
        assert by_cluster["zz"]["role"] == "draft" and by_cluster["zz"]["current_cap"] == 256
        assert by_cluster["prod"] == {"cluster": "prod", "role": "draft", "skipped": "no 'draft' ranks (roles: target)"}
        nobody = capwatch("advise", "--url", server.url, "--role", "sp_prefill")
        assert nobody.returncode == 2 and "no cluster has 'sp_prefill' ranks (clusters: prod, zz)" in nobody.stderr
        explicit = capwatch("advise", "--url", server.url, "--cluster", "zz")  # asked for by name: said why not
        assert explicit.returncode == 2 and "has no 'target' ranks; roles: draft" in explicit.stderr
