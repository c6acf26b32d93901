"""What a scrape of a rank and of the service finds, as Prometheus would scrape them: ``capwatch_build_info`` with
the installed version, no ``*_created`` series, the group's label ``ep_group`` (the old ``cluster`` only on request,
for one release), fixed histogram buckets, and nothing ``promtool check metrics`` objects to. Real gloo ranks
report to a real ``capwatch serve``; both are scraped over HTTP."""

from __future__ import annotations

import time
import urllib.request
from importlib.metadata import version

import pytest
from capwatch.telemetry.catalogue import RUNTIME_TOKEN_BUCKETS
from capwatch.telemetry.exporter import RankExporter
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from tests.support.service import ServiceProcess

from .group import RankGroup
from .promtool import promtool_findings
from .rank_program import RankPlan

GROUP = "scraped"


def scrape(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> list:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def series_names(text: str) -> set[str]:
    """Every series name as exposed, ``_created`` included (the parser folds none away)."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


@pytest.fixture(scope="module", params=[False, True], ids=["default", "legacy-cluster-label"])
def scraped(request, tmp_path_factory):
    """Two ranks reporting to the service, both scraped once the service holds the group."""
    legacy = request.param
    env = {"CAPWATCH_LEGACY_CLUSTER_LABEL": "true"} if legacy else {}
    service = ServiceProcess(tmp_path_factory.mktemp("service") / "capwatch.db", env=env).start(timeout_s=60)
    group = RankGroup(2, RankPlan(cluster=GROUP, service_url=service.url, interval_s=0.2,
                                  legacy_cluster_label=legacy))
    try:
        group.command("steps", 20)
        group.command("cut")
        deadline = time.monotonic() + 30
        while GROUP not in scrape(f"{service.url}/metrics") and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = [scrape(url) for url in group.metrics_urls]
        service_text = scrape(f"{service.url}/metrics")
    finally:
        group.close()
        service.stop()
    return legacy, ranks, service_text


def test_build_info_on_every_rank_and_the_service(scraped):
    _, ranks, service_text = scraped
    for text in [*ranks, service_text]:
        info = [sample for sample in samples(text) if sample.name == "capwatch_build_info"]
        assert len(info) == 1 and info[0].value == 1
        assert info[0].labels["version"] == version("a2a-capwatch")  # the installed distribution's


def test_no_created_series_anywhere(scraped):
    _, ranks, service_text = scraped
    for text in [*ranks, service_text]:
        assert not [name for name in series_names(text) if name.endswith("_created")]
    # The service's own counters and histogram are prometheus_client's, which add _created unless told not to.
    assert "capwatch_reports_ingested_total" in series_names(service_text)


def test_the_group_label_is_ep_group_and_cluster_only_on_request(scraped):
    legacy, ranks, service_text = scraped
    rank_series = [sample for text in ranks for sample in samples(text) if sample.name.startswith("moe_a2a_")]
    service_series = [sample for sample in samples(service_text) if sample.name == "capwatch_cluster_cap_tokens"]
    assert rank_series and service_series
    for sample in [*rank_series, *service_series]:
        assert sample.labels["ep_group"] == GROUP, sample
        assert sample.labels.get("cluster") == (GROUP if legacy else None), sample


def test_the_histogram_has_the_fixed_buckets_and_promtool_is_clean(scraped):
    _, ranks, service_text = scraped
    for text in ranks:
        bounds = [float(sample.labels["le"]) for sample in samples(text)
                  if sample.name == "moe_a2a_runtime_tokens_bucket"]
        assert bounds == [*RUNTIME_TOKEN_BUCKETS, float("inf")]  # 34 series a rank role, whatever the cap
        assert promtool_findings(text.encode()) == []
    assert promtool_findings(service_text.encode()) == []


def test_a_registry_without_the_filter_would_have_shown_created():
    """The check above can fail: prometheus_client's own counter exposes _created; capwatch's registry drops it."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    plain = CollectorRegistry()
    Counter("capwatch_probe", "A probe.", registry=plain).inc()
    assert "capwatch_probe_created" in generate_latest(plain).decode()
    exporter = RankExporter()
    Counter("capwatch_probe", "A probe.", registry=exporter.registry).inc()
    exporter.registry.register(_Family())
    text = exporter.render().decode()
    assert "_created" not in text and "capwatch_probe_total 1.0" in text and "capwatch_build_info{" in text


class _Family:
    def collect(self):
        family = CounterMetricFamily("moe_a2a_probe", "A probe.", labels=["ep_group"], created=1.0)
        family.add_metric(["g"], 1, created=1.0)
        yield family
