"""The reporter against the real service: ``capwatch serve`` on SQLite (the one launcher,
``capwatch.demo.service.ServiceProcess``, started as ``tests.support.service`` starts it), stopped and restarted (same port, same database) while two
gloo ranks keep dispatching."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.service import ServiceProcess

from .group import RankGroup
from .rank_program import RankPlan
from .workload import Workload, expected_totals

TOKEN = "e2e-token"


class Service(ServiceProcess):
    """The real service, with a JSON getter that ignores proxy settings."""

    def __init__(self, db_path: Path):
        super().__init__(db_path, env={"CAPWATCH_TOKEN": TOKEN})

    def get(self, path: str):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.url + path, timeout=10) as response:
            body = response.read()
        return json.loads(body) if response.headers.get_content_type() == "application/json" else body.decode()


@pytest.fixture
def service(tmp_path):
    service = Service(tmp_path / "capwatch.db").start(timeout_s=60)
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
