"""The reporter against the real service: uvicorn running ``service.main:create_app`` on SQLite,
stopped and restarted (same port, same database) while two gloo ranks keep dispatching."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .group import RankGroup
from .rank_program import RankPlan
from .workload import Workload, expected_totals

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-token"


class Service:
    """uvicorn in its own process group, serving on a socket this test bound (no port race)."""

    def __init__(self, db_path: Path):
        self.db_path = db_path
        self.port = 0
        self.process: subprocess.Popen | None = None

    def start(self) -> "Service":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        env = os.environ | {"PYTHONPATH": str(REPO_ROOT), "CAPWATCH_DB_PATH": str(self.db_path),
                            "CAPWATCH_TOKEN": TOKEN}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--fd", str(listener.fileno()),
             "--log-level", "warning"],
            pass_fds=(listener.fileno(),), env=env, cwd=REPO_ROOT, start_new_session=True)
        listener.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.get("/healthz") is not None:
                    return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not come up (exit code {self.process.poll()})")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.url + path, timeout=10) as response:
            body = response.read()
        return json.loads(body) if response.headers.get_content_type() == "application/json" else body.decode()


@pytest.fixture
def service(tmp_path):
    service = Service(tmp_path / "capwatch.db").start()
    yield service
    service.stop()


def test_reports_reach_the_real_service_exactly_once_across_a_service_restart(service):
    workload = Workload()
    group = RankGroup(2, RankPlan(cluster="e2e", service_url=service.url, interval_s=0.2, bearer_token=TOKEN))
    try:
        group.command("steps", 20)
        service.stop()
        group.command("steps", 30)  # dispatching while the service is down
        time.sleep(0.6)  # a few intervals pile up
        service.start()  # same port, same database
        statuses = group.exit()
    finally:
        group.close()

    expected = expected_totals(workload, 2, range(statuses[0]["step"]))
    view = service.get("/v1/clusters/e2e")
    assert view["ep_size"] == 2 and view["cap"] == workload.cap
    assert view["overflow_events_total"] == 0
    ranks = {rank["ep_rank"]: rank for rank in view["ranks"]}
    for status in statuses:
        rank = ranks[status["rank"]]
        assert rank["boot_id"] == status["boot_id"] and rank["final"]
        assert rank["forward_steps_total"] == expected.forward_steps == 50  # every interval counted once
        assert rank["max_runtime_tokens"] == expected.max_runtime_tokens
        assert status["reporter"]["send_failures"] > 0 and status["reporter"]["rejected"] == 0
    metrics = service.get("/metrics")
    assert "capwatch_reports_rejected_total{" not in metrics or all(
        line.endswith(" 0.0") for line in metrics.splitlines() if line.startswith("capwatch_reports_rejected_total{"))
