"""The service reading a real Prometheus that scrapes real per-rank exporters (telemetry's)."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import JSON
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.service.config import Settings
from capwatch.service.main import create_app
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import ExporterOptions, RankExporter
from capwatch.telemetry.intervals import IntervalTracker
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankIdentity
from tests.support.ports import free_port
from tests.support.prometheus import scrape_config, start_prometheus
from tests.support.waiting import wait_for

EP_SIZE = 4
CAP = 1024
HOT_RANK = 2

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus (make system-deps)")


class Rank:
    def __init__(self, ep_rank: int):
        self.counters = DispatchCounters(CAP, EP_SIZE, role="target")
        identity = RankIdentity(cluster="prom-a", ep_rank=ep_rank, ep_size=EP_SIZE, role="target",
                                boot_id=f"boot{ep_rank}")
        self.config = rank_config(cap=CAP, ep_size=EP_SIZE, hidden_size=4096, top_k=8, num_experts=64,
                                  backend="torch")
        collector = DispatchCollector(IntervalTracker(self.counters), identity, self.config, interval_s=1.0)
        self.exporter = RankExporter(collector)
        self.port = self.exporter.serve(ExporterOptions(base_port=0))


@pytest.fixture
def ranks():
    ranks = [Rank(rank) for rank in range(EP_SIZE)]
    yield ranks
    for rank in ranks:
        rank.exporter.close()


@pytest.fixture
def prometheus(tmp_path, ranks):
    config = scrape_config([f"127.0.0.1:{rank.port}" for rank in ranks], job="ranks")
    with start_prometheus(tmp_path / "prometheus", config) as server:
        yield server.url


def drive(ranks: list[Rank], stop: threading.Event, overflow: threading.Event) -> None:
    """Steps on every rank: the hot rank peaks near 900; once ``overflow`` is set, one step of
    1100 tokens overflows rank 1."""
    step = 0
    overflowed = False
    while not stop.is_set():
        for rank_index, rank in enumerate(ranks):
            if rank_index == 1 and overflow.is_set() and not overflowed:
                overflowed = True
                rank.counters.record_step(1100)
                rank.counters.record_overflow("runtime_over_cap", "raised")
            else:
                rank.counters.record_step(850 + step % 50 if rank_index == HOT_RANK else 100 + step % 100)
        step += 1
        time.sleep(0.05)


def test_views_and_advice_from_a_real_prometheus(tmp_path, ranks, prometheus):
    settings = Settings(prometheus_url=prometheus, window_s=3.0, stale_after_s=10.0, missing_after_s=30.0,
                        advisor={"min_samples": 4, "min_history_s": 9.0})
    stop, overflow = threading.Event(), threading.Event()
    driver = threading.Thread(target=drive, args=(ranks, stop, overflow))
    driver.start()
    try:
        with TestClient(create_app(settings), base_url="http://localhost", headers=JSON) as client:
            assert client.get("/healthz").json()["source"] == "prometheus"
            wait_for(lambda: client.get("/v1/clusters").json(), 30, "the cluster to appear")
            wait_for(lambda: client.get("/v1/clusters/prom-a/advice").json()["sample_count"] >= 2, 30, "samples")
            overflow.set()  # after Prometheus has seen the counters at zero, so increase() sees it
            advice = wait_for(lambda: (lambda a: a if a["sample_count"] >= 5 and a["overflow_windows"] else None)(
                client.get("/v1/clusters/prom-a/advice").json()), 60, "five windows of samples")
            view = client.get("/v1/clusters/prom-a").json()
            assert [rank["state"] for rank in view["ranks"]] == ["reporting"] * EP_SIZE
            assert view["cap"] == CAP and view["ep_size"] == EP_SIZE and view["findings"] == []
            # Prometheus sees no boots: unknown, not made up.
            assert {(rank["boot_id"], rank["boots"]) for rank in view["ranks"]} == {(None, None)}
            assert view["group_max_runtime_tokens"] == 1100 and view["overflow_events_total"] == 1
            assert view["ranks"][1]["overflow_events"] == {"runtime_over_cap/raised": 1}
            assert view["workspace_bytes_per_rank"] == ranks[0].config.workspace_bytes_per_rank
            assert view["ranks"][HOT_RANK]["max_runtime_tokens"] >= 850
            # The overflow on rank 1 sets the group's sample: raise above it.
            assert advice["action"] == "raise" and advice["recommended_cap"] >= 1100 * 1.15
            assert advice["max_peak_runtime_tokens"] == 1100 and advice["current_cap"] == CAP
            assert advice["predicted_overflow_rate_current"] > 0
            whatif = client.get("/v1/clusters/prom-a/whatif", params={"cap": 2048}).json()
            assert whatif[0]["predicted_overflow_rate"] == 0.0
            history = client.get("/v1/clusters/prom-a/history").json()
            assert {series["ep_rank"] for series in history["ranks"]} == set(range(EP_SIZE))
            assert max(p["peak_runtime_tokens"] for p in history["ranks"][HOT_RANK]["points"]) >= 850
            assert "capwatch_recommended_cap_tokens{dispatcher=\"target\",ep_group=\"prom-a\"}" in client.get("/metrics").text
            # A rank whose exporter goes away is reported missing once Prometheus marks it stale.
            ranks[3].exporter.close()
            findings = wait_for(lambda: [f for f in client.get("/v1/clusters/prom-a").json()["findings"]
                                         if f["kind"] == "missing_rank"], 30, "rank 3 to go missing")
            assert findings[0]["ranks"] == [3]
    finally:
        stop.set()
        driver.join()


def test_prometheus_down_is_a_503_not_a_crash(tmp_path):
    settings = Settings(prometheus_url=f"http://127.0.0.1:{free_port()}", prometheus_timeout_s=2.0)
    with TestClient(create_app(settings), base_url="http://localhost", headers=JSON) as client:
        response = client.get("/v1/clusters")
        assert response.status_code == 503 and "cannot reach Prometheus" in response.json()["detail"]
        assert client.post("/v1/reports", content=b"{}").status_code in (422, 503)
        assert client.get("/metrics").status_code == 200

