"""The same advice from reports and from Prometheus (issue 12): the same ranks both post their reports
to the service on SQLite and are scraped by a real Prometheus; ``capwatch serve`` on either source
answers the same advice for a group whose floor binds, and the Prometheus source rebuilds exactly the
configs the reports carried (SGLang's floor inputs, the model geometry, the CUDA-graph floor inputs)
and each rank's own largest local batch."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from fastapi.testclient import TestClient

from capwatch.dispatcher.counters import DispatchCounters
from capwatch.advisor.evidence import GroupConfig
from capwatch.sglang_engine.floor import merged_sglang_limits
from capwatch.advisor.kv import kv_bytes_per_token_of
from capwatch.backends.flashinfer import WorkspacePricing
from capwatch.advisor.recommend import recommend
from capwatch.service.config import Settings
from capwatch.service.main import create_app, store_options
from capwatch.service.sources.prometheus.source import PrometheusSource
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import ExporterOptions, RankExporter
from capwatch.telemetry.rank import rank_config
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.telemetry.report import RankIdentity, RankReport
from capwatch.telemetry.reporter import RankReporter, ReporterOptions, SendResult, classify_status
from tests.service.conftest import JSON
from tests.support.prometheus import scrape_config, start_prometheus
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus (make system-deps)")

CLUSTER = "parity"
EP_SIZE = 2
CAP = 4096  # set by the env var; SGLang started with it
# A unified server (qwen3-30b-a3b's geometry): SGLang's floor is its prefill chunk of 2048 tokens, above
# its verify graph 256 x 4; the CUDA-graph fields of the report give 256 x (1 + 3) = 1024.
LIMITS = SGLangLimits(sglang_version="0.5.23", disaggregation_mode="null", max_prefill_buffer_tokens=2048,
                      decode_cuda_graph_max_batch_size=256, tokens_per_request=4, cap_source="env")
HOT_RANK = 1
WINDOW_S = 2.0


class Rank:
    """One rank: its counters, a reporter posting to the SQLite service, an exporter Prometheus scrapes."""

    def __init__(self, ep_rank: int, post):
        self.counters = DispatchCounters(CAP, EP_SIZE)
        identity = RankIdentity(cluster=CLUSTER, ep_rank=ep_rank, ep_size=EP_SIZE, boot_id=f"parity{ep_rank}")
        self.config = rank_config(cap=CAP, ep_size=EP_SIZE, hidden_size=2048, top_k=8, num_experts=128,
                                  backend="torch", cuda_graph_max_batch_size=256, speculative_tokens=3, sglang=LIMITS)
        self.reporter = RankReporter(self.counters, identity, self.config,
                                     ReporterOptions(service_url="http://localhost", interval_s=0.5), sender=post)
        collector = DispatchCollector(self.reporter.tracker, identity, self.config, peak_window_s=WINDOW_S,
                                      reporter_stats=self.reporter.stats)
        self.exporter = RankExporter(collector)
        self.port = self.exporter.serve(ExporterOptions(base_port=0))

    def close(self) -> None:
        self.reporter.close()
        self.exporter.close()


def drive(ranks: list[Rank], stop: threading.Event) -> None:
    """R between 300 and 450 (far below the floor); the hot rank's own batch is R, the other's a third."""
    step = 0
    while not stop.is_set():
        runtime_tokens = 300 + (step * 37) % 151
        for index, rank in enumerate(ranks):
            rank.counters.record_step(runtime_tokens, runtime_tokens if index == HOT_RANK else runtime_tokens // 3)
        step += 1
        time.sleep(0.02)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(db_path=tmp_path / "capwatch.db", window_s=WINDOW_S, stale_after_s=10.0, missing_after_s=30.0,
                    prometheus_cache_s=0.0, advisor={"min_samples": 4, "min_history_s": 8.0,
                                                        "change_min_history_s": 0.0})  # act on seconds of history


@pytest.fixture
def reports_app(settings):
    store = Store(settings.db_path, store_options(settings))
    with TestClient(create_app(settings, store=store), base_url="http://localhost", headers=JSON) as client:
        yield client, store
    store.close()


@pytest.fixture
def ranks(reports_app):
    client, _ = reports_app
    lock = threading.Lock()

    def post(report: RankReport) -> SendResult:
        with lock:  # the reporters' threads share one test client
            response = client.post("/v1/reports", content=json.dumps(report.model_dump(mode="json")))
        return SendResult(classify_status(response.status_code), f"HTTP {response.status_code}")

    ranks = [Rank(ep_rank, post) for ep_rank in range(EP_SIZE)]
    for rank in ranks:
        rank.reporter.start()
    yield ranks
    for rank in ranks:
        rank.close()


@pytest.fixture
def prometheus(tmp_path, ranks):
    config = scrape_config([f"127.0.0.1:{rank.port}" for rank in ranks], job="ranks")
    with start_prometheus(tmp_path / "prometheus", config) as server:
        yield server.url


def advised(client: TestClient) -> dict | None:
    advice = client.get(f"/v1/clusters/{CLUSTER}/advice")
    return advice.json() if advice.status_code == 200 and advice.json()["action"] != "insufficient_data" else None


def test_reports_and_prometheus_give_the_same_advice_and_the_floor_binds(settings, reports_app, ranks, prometheus):
    reports, store = reports_app
    stop = threading.Event()
    driver = threading.Thread(target=drive, args=(ranks, stop))
    driver.start()
    prometheus_settings = settings.model_copy(update={"prometheus_url": prometheus})
    source = PrometheusSource(prometheus, prometheus_settings)
    try:
        with TestClient(create_app(prometheus_settings), base_url="http://localhost", headers=JSON) as scraped:
            assert scraped.get("/healthz").json()["source"] == "prometheus"
            from_reports = wait_for(lambda: advised(reports), 60, "advice from reports")
            from_prometheus = wait_for(lambda: advised(scraped), 60, "advice from Prometheus")
            from_reports = advised(reports)

            # The configs the reports carried, rebuilt from the series: SGLang's limits, geometry, floor inputs.
            stored = {state.ep_rank: state for state in store.rank_states(CLUSTER)}
            rebuilt = {state.ep_rank: state for state in source.rank_states(CLUSTER)}
            assert set(stored) == set(rebuilt) == set(range(EP_SIZE))
            for ep_rank, state in stored.items():
                assert rebuilt[ep_rank].config.model_dump() == state.config.model_dump()
                assert rebuilt[ep_rank].config.sglang == LIMITS
            # ... in four instant queries however many series a rank has (the cost of every request and scrape).
            queries: list[str] = []
            source.api.client.event_hooks["request"].append(lambda request: queries.append(request.url.path))
            assert len(source.rank_states(CLUSTER)) == EP_SIZE and queries == ["/api/v1/query"] * 4
            # Each rank's own largest local batch: the hot rank's is R, the other's a third of it.
            assert rebuilt[HOT_RANK].max_local_tokens == rebuilt[HOT_RANK].max_runtime_tokens >= 300
            assert rebuilt[0].max_local_tokens == rebuilt[HOT_RANK].max_runtime_tokens // 3
            rows = source.interval_rows(CLUSTER, "target", time.time() - 120, time.time(), 1000)
            ran = [row for row in rows if row.forward_steps]
            assert ran and all(row.max_local_tokens is not None and row.max_local_tokens <= row.peak_runtime_tokens
                               for row in ran)
            assert max(row.max_local_tokens for row in ran if row.ep_rank == HOT_RANK) == max(
                row.peak_runtime_tokens for row in ran)

            # The same advice either way: lowered to the floor, which binds, with the same reason.
            for field in ("action", "current_cap", "recommended_cap", "target_cap", "floor_cap", "floor_binds",
                          "ep_size", "workspace_bytes_per_rank_current", "workspace_bytes_per_rank_recommended",
                          "workspace_bytes_group_delta", "env", "kv_bytes_per_token", "kv_cache_tokens_per_rank_freed"):
                assert from_prometheus[field] == from_reports[field], field
            assert from_reports["action"] == "lower" and from_reports["floor_binds"]
            # The service's own views hand SGLang's limits to the advisor: its prefill chunk binds over HTTP.
            assert from_reports["recommended_cap"] == from_reports["floor_cap"] == 2048
            assert from_reports["floor_binds"] == "the prefill chunk (max prefill buffer) of 2048 tokens"
            assert from_reports["kv_cache_tokens_per_rank_freed"] > 0
            assert any(reason.startswith(f"raised to the floor {from_reports['floor_cap']}")
                       for reason in from_prometheus["reasons"])

            # SGLang's own rule from the rebuilt limits: its prefill chunk binds (2048), from either source.
            for states, history in ((list(stored.values()), store.sample_history(CLUSTER, "target")),
                                    (list(rebuilt.values()), source.sample_history(CLUSTER, "target"))):
                config = states[0].config  # the geometry prices the workspace and the KV-cache tokens
                group = GroupConfig(
                    cap=CAP, pricing=WorkspacePricing.of_config(states[0].config, EP_SIZE),
                    engine_limits=merged_sglang_limits(state.config.sglang for state in states),
                    kv_bytes_per_token=kv_bytes_per_token_of(config.hidden_size, config.top_k, config.num_experts))
                assert group.kv_bytes_per_token and group.pricing.geometry is not None
                advice = recommend(history, group, prometheus_settings.advisor)
                assert advice.floor_cap == advice.recommended_cap == 2048 and advice.action == "lower"
                assert advice.floor_binds == "the prefill chunk (max prefill buffer) of 2048 tokens"
                assert advice.kv_cache_tokens_per_rank_freed > 0
    finally:
        stop.set()
        driver.join()
        source.close()
