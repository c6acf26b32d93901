"""The exporter in this process: registry isolation, ports, ASGI mount, catalogue conformance, lint."""

import asyncio
import urllib.request

import httpx
import pytest
import torch
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from capwatch.dispatcher.counters import DispatchCounters
from capwatch.telemetry import catalogue
from capwatch.telemetry.exporter import ExporterOptions
from capwatch.telemetry.rank import RankTelemetry, rank_config
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import new_boot_id
from tests.support.ports import free_port_pair

from .promtool import promtool_findings

CAP = 128


def telemetry_for(ep_rank: int, counters: DispatchCounters, **options) -> RankTelemetry:
    identity = RankIdentity(cluster="unit", ep_rank=ep_rank, ep_size=2, boot_id=new_boot_id())
    config = rank_config(cap=CAP, ep_size=2, hidden_size=64, top_k=4, num_experts=8, backend="torch",
                         allocated_workspace_bytes=1 << 20)
    return RankTelemetry(counters, identity, config, **options)


def busy_counters() -> DispatchCounters:
    counters = DispatchCounters(CAP, 2)
    for r in (1, 64, 128, 129, 500):
        counters.record_step(r, r // 4)  # this rank's own local batch: a quarter of the group's R
        counters.record_dispatch(torch.tensor([r, 2]), torch.tensor([3, r]))
    counters.record_overflow("runtime_over_cap", "chunked", chunked_rounds=4)
    return counters


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_every_catalogue_metric_is_exported_with_its_type_help_and_labels_and_lint_is_clean():
    telemetry = telemetry_for(0, busy_counters(), exporter=None)
    telemetry.tracker.close()  # an interval closed: the peak gauges have a value
    text = telemetry.exporter.render()
    assert promtool_findings(text) == []
    exported = families(text.decode())
    for spec in catalogue.METRICS:
        if spec.name.startswith("moe_a2a_report"):
            continue  # only with a reporter
        # The text format has no info type: an info metric is a gauge named ..._info with value 1.
        family = exported[spec.name.removesuffix("_total") if spec.type == "counter" else spec.name]
        assert family.type == ("gauge" if spec.type == "info" else spec.type) and family.documentation == spec.help
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels), spec.name
    assert exported["moe_a2a_interval_peak_utilization_ratio"].samples[0].value == 500 / CAP
    # Each rank's own line: its largest local batch (125), not the group's R (500).
    assert exported["moe_a2a_interval_max_local_tokens"].samples[0].value == 125
    assert exported["moe_a2a_local_tokens_window_max"].samples[0].value == 125
    # The histogram's _sum is the exact sum of R, the over-cap steps (129 and 500) included.
    runtime_tokens = {sample.name: sample.value for sample in exported["moe_a2a_runtime_tokens"].samples}
    assert runtime_tokens["moe_a2a_runtime_tokens_sum"] == 1 + 64 + 128 + 129 + 500
    assert runtime_tokens["moe_a2a_runtime_tokens_count"] == 5


def test_two_exporters_in_one_process_keep_their_own_registries_off_the_global_one():
    first = telemetry_for(0, busy_counters(), exporter=ExporterOptions(base_port=0)).start()
    second = telemetry_for(1, DispatchCounters(CAP, 2), exporter=ExporterOptions(base_port=0)).start()
    try:
        assert first.exporter.registry is not second.exporter.registry
        # No family of the ranks' leaks into the global registry, under any label (the group's label was renamed
        # once; a sample lookup by labels would pass whatever the registry held).
        assert not [family.name for family in REGISTRY.collect() if family.name.startswith("moe_a2a_")]
        values = [families(urllib.request.urlopen(t.metrics_url, timeout=10).read().decode())
                  ["moe_a2a_forward_steps"].samples[0] for t in (first, second)]
        assert [(v.labels["ep_rank"], v.value) for v in values] == [("0", 5.0), ("1", 0.0)]
    finally:
        first.close()
        second.close()


def test_each_local_rank_serves_on_base_port_plus_local_rank_on_loopback():
    base = free_port_pair()
    ranks = [telemetry_for(rank, DispatchCounters(CAP, 2),
                           exporter=ExporterOptions(base_port=base, local_rank=rank)).start() for rank in (0, 1)]
    try:
        assert [t.exporter.port for t in ranks] == [base, base + 1]
        assert all(t.metrics_url.startswith("http://127.0.0.1:") for t in ranks)
        with pytest.raises(OSError, match="pick another base port"):
            telemetry_for(0, DispatchCounters(CAP, 2), exporter=ExporterOptions(base_port=base)).start()
    finally:
        for t in ranks:
            t.close()


def test_mountable_as_an_asgi_app():
    telemetry = telemetry_for(0, busy_counters(), exporter=None)

    async def scrape() -> httpx.Response:
        transport = httpx.ASGITransport(app=telemetry.exporter.asgi_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://rank") as client:
            return await client.get("/metrics")

    response = asyncio.run(scrape())
    assert response.status_code == 200
    assert families(response.text)["moe_a2a_dispatch_calls"].samples[0].value == 5


@pytest.mark.parametrize("options, message", [
    (dict(base_port=65535, local_rank=1), "outside 1..65535"),
    (dict(base_port=-1), "outside"),
    (dict(local_rank=-1), "local_rank must be >= 0"),
    (dict(host="bad host"), "neither an IP address nor a host name"),
])
def test_bad_exporter_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        ExporterOptions(**options)


def test_openmetrics_negotiation_renders_and_parses_back():
    """Prometheus asks for OpenMetrics first: units and _total must be consistent there, too."""
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

    telemetry = telemetry_for(0, busy_counters(), exporter=None)
    telemetry.tracker.close()
    parsed = {family.name: family for family in parse_openmetrics(
        generate_openmetrics(telemetry.exporter.registry).decode())}
    assert parsed["moe_a2a"].type == "info"
    assert parsed["moe_a2a_forward_steps"].type == "counter" and parsed["moe_a2a_forward_steps"].unit == "steps"
    assert parsed["moe_a2a_runtime_tokens"].unit == "tokens"
    assert parsed["moe_a2a_tokens_sent"].unit == ""  # the name does not end in the unit: none declared
