"""How often a request or a /metrics scrape reads the source, and what the per-cluster gauges say
per dispatcher. Against Prometheus one ``rank_states`` is four instant queries and one
``sample_history`` three range queries (one per field of the window rule), so these counts are the cost
of every scrape."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from capwatch.service.config import Settings
from capwatch.service.main import create_app
from capwatch.service.sources.prometheus.source import PrometheusSource
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import JSON, T0, FakeClock
from tests.support.prometheus import scrape_config, start_prometheus
from tests.support.simulate import SimulatedRank


class CountingSource:
    """The real store, with every ClusterSource call counted."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str):
        attribute = getattr(self.inner, name)
        if not callable(attribute):
            return attribute

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted


def feed(client: TestClient, clock: FakeClock, cluster: str, caps: dict[str, int], windows: int = 30) -> None:
    """Two ranks per role; the draft ranks peak lower than the target ranks."""
    ranks = [SimulatedRank(cluster, rank, 2, cap=cap, role=role) for role, cap in caps.items() for rank in range(2)]
    for window in range(windows):
        clock.now = T0 + 60 * window + 60
        for rank in ranks:
            peak = 300 if rank.role == "target" else 40
            body = rank.report(T0 + 60 * window, T0 + 60 * window + 59, [peak])
            assert client.post("/v1/reports", content=json.dumps(body)).status_code == 202


@pytest.fixture
def counting(settings, store, clock):
    source = CountingSource(store)
    app = create_app(settings, store=store, clock=clock, source=source)
    with TestClient(app, base_url="http://localhost", headers=JSON) as client:
        app.state.digests.stop_refresher()  # the counts are a request's own reads, not the background's
        yield client, source


def test_a_scrape_or_a_request_reads_each_clusters_ranks_once(counting, clock):
    client, source = counting
    feed(client, clock, "a", {"target": 256, "draft": 128})
    feed(client, clock, "b", {"target": 512})
    source.calls.clear()
    assert client.get("/metrics").status_code == 200
    assert source.calls["rank_states"] == 2  # one per cluster, shared by both roles' view and advice
    assert source.calls["sample_history"] == 3  # one per (cluster, role)
    # Unchanged since the scrape read them (same generation, no rank's status due to change): reused.
    for path, reads in (("/v1/clusters", 0), ("/v1/clusters/a", 1), ("/v1/clusters/a/advice", 0)):
        source.calls.clear()
        assert client.get(path).status_code == 200
        assert source.calls["rank_states"] == reads, path
    now = clock.now
    feed(client, clock, "a", {"target": 256}, windows=1)  # cluster a changed: only its ranks are read again
    clock.now = now  # (feed dates its reports from T0)
    source.calls.clear()
    assert client.get("/v1/clusters").status_code == 200
    assert source.calls["rank_states"] == 1


def test_every_cluster_gauge_carries_the_dispatcher(counting, clock):
    client, _ = counting
    feed(client, clock, "a", {"target": 256, "draft": 128})
    feed(client, clock, "drafty", {"draft": 128})  # draft ranks only: exported too
    families = {family.name: family for family in text_string_to_metric_families(client.get("/metrics").text)}
    caps = {(s.labels["ep_group"], s.labels["dispatcher"]): s.value
            for s in families["capwatch_cluster_cap_tokens"].samples}
    assert caps == {("a", "target"): 256, ("a", "draft"): 128, ("drafty", "draft"): 128}
    recommended = {(s.labels["ep_group"], s.labels["dispatcher"]): s.value
                   for s in families["capwatch_recommended_cap_tokens"].samples}
    assert recommended[("a", "target")] == 512  # 300 x 1.15, aligned up; the draft's own peaks are far lower
    assert recommended[("a", "draft")] == 128
    for name in ("capwatch_cluster_cap_tokens", "capwatch_recommended_cap_tokens", "capwatch_advice_action",
                 "capwatch_consistency_findings", "capwatch_ranks", "capwatch_cluster_workspace_bytes",
                 "capwatch_recommended_workspace_bytes", "capwatch_recommended_cap_lower_tokens",
                 "capwatch_recommended_cap_upper_tokens"):
        assert families[name].samples and all(s.labels["dispatcher"] in ("target", "draft")
                                              for s in families[name].samples), name
    ranks = {(s.labels["ep_group"], s.labels["dispatcher"], s.labels["state"]): s.value
             for s in families["capwatch_ranks"].samples}
    assert ranks[("a", "draft", "reporting")] == 2 and ranks[("a", "target", "reporting")] == 2


@pytest.fixture
def prometheus(tmp_path):
    """A real Prometheus that scrapes nothing: only the queries capwatch sends it are counted."""
    with start_prometheus(tmp_path / "prometheus", scrape_config([], job="ranks")) as server:
        yield server.url


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus (make system-deps)")
def test_prometheus_history_is_reused_within_a_window_not_requeried(prometheus):
    clock = FakeClock(T0)
    source = PrometheusSource(prometheus, Settings(prometheus_url=prometheus, window_s=60.0,
                                                   prometheus_cache_s=30.0), clock)
    queries: list[str] = []
    source.api.client.event_hooks["request"].append(lambda request: queries.append(request.url.path))
    try:
        first = source.sample_history("a", "target")
        assert len(queries) == 3 and first.sample_count == 0
        clock.now += 10
        source.sample_history("a", "target")
        assert len(queries) == 3  # a second scrape within the TTL: no new queries
        source.sample_history("a", "draft")
        assert len(queries) == 6  # another role is another history
        clock.now += 30
        source.sample_history("a", "target")
        assert len(queries) == 9  # expired: read again
    finally:
        source.close()

