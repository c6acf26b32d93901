"""End to end: a real Prometheus (the Debian package) scrapes a real 4-rank run and the real capwatch service,
evaluates our rules, and answers every dashboard query and every recording rule.

The stack: ``capwatch serve`` (started by ``capwatch.demo.service``); four rank processes in a
gloo group running the instrumented dispatcher with their exporters and reporters (``e2e_rank.py``), and a second
group of two whose reports and series say DeepEP's low-latency buffer; and Prometheus scraping them all every
second with ``dashboards/rules/capwatch.rules.yml`` loaded. One set of dashboards, rules and views serves both
backends, each naming its own variable.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from capwatch.dashboards import service_metrics
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.flashinfer import RULES as FLASHINFER
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.model_presets import custom_geometry
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token
from capwatch.telemetry import catalogue

from capwatch.demo.ranks import spawn_ranks
from tests.dashboards import e2e_rank, lint
from tests.dashboards.conftest import RULES_FILE
from tests.support.prometheus import scrape_config, start_prometheus
from tests.support.service import ServiceProcess

EP_SIZE = 4
CLUSTER = "e2e-group"
DEEPEP_CLUSTER = "e2e-deepep"  # a DeepEP group beside the FlashInfer one
DEEPEP_EP_SIZE = 2
# Grafana's $__rate_interval is max(4 x scrape interval, $__interval + scrape interval); with 1 s scrapes and
# a short test, 10s keeps several samples in every window.
RATE_INTERVAL = "10s"
READY_TIMEOUT_S = 120


def _get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Stack:
    prometheus_url: str
    service_url: str
    rank_ports: list[int]
    logs: Path

    def query(self, expr: str) -> list[dict]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = _get_json(url)
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def values(self, expr: str) -> dict[str, float]:
        """{ep_rank or '': value} of an instant query."""
        return {sample["metric"].get("ep_rank", ""): float(sample["value"][1]) for sample in self.query(expr)}

    def log_tail(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.logs.glob("*.log")))


def _start_service(run_dir: Path) -> ServiceProcess:
    """The real ``capwatch serve``, with windows and history short enough to recommend within a test run
    (defaults: 60 s windows, 20 samples, 10 min of history)."""
    env = {"CAPWATCH_WINDOW_S": "1", "CAPWATCH_ADVISOR__MIN_SAMPLES": "3", "CAPWATCH_ADVISOR__MIN_HISTORY_S": "2",
           "CAPWATCH_MAINTENANCE_INTERVAL_S": "1"}
    return ServiceProcess(run_dir / "capwatch.db", env=env, log_path=run_dir / "service.log").start()


def _prometheus_config(rank_ports: list[int], service_url: str) -> dict:
    # The job names of dashboards/prometheus.yml: MoeA2ARankDown watches capwatch-ranks.
    return scrape_config([f"127.0.0.1:{port}" for port in rank_ports], job="capwatch-ranks",
                         rule_files=[str(RULES_FILE)],
                         extra_jobs={"capwatch-service": [urllib.parse.urlsplit(service_url).netloc]})


def _wait_for(condition, what: str, stack: Stack, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}\n{stack.log_tail()}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prometheus_binary) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("e2e")
    prometheus = None
    rank_errors: list[BaseException] = []
    ranks_threads: list[threading.Thread] = []
    service = None
    try:
        service = _start_service(run_dir)
        service_url = service.url

        def run_ranks(size: int, cluster: str, a2a_backend: str) -> None:
            try:
                spawn_ranks(size, e2e_rank.serve_rank, cluster, service_url, str(run_dir),
                            float(READY_TIMEOUT_S + 60), a2a_backend, timeout_s=READY_TIMEOUT_S + 120)
            except BaseException as error:  # surfaced by the fixture below
                rank_errors.append(error)

        ranks_threads = [threading.Thread(target=run_ranks, args=arguments, name=f"capwatch-e2e-{arguments[2]}",
                                          daemon=True)
                         for arguments in ((EP_SIZE, CLUSTER, FLASHINFER.name),
                                           (DEEPEP_EP_SIZE, DEEPEP_CLUSTER, DEEPEP.name))]
        for thread in ranks_threads:
            thread.start()
        port_files = [run_dir / f"{e2e_rank.port_file_name(rank, backend)}.port"
                      for size, backend in ((EP_SIZE, FLASHINFER.name), (DEEPEP_EP_SIZE, DEEPEP.name))
                      for rank in range(size)]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(path.exists() for path in port_files):
            if rank_errors or time.monotonic() > deadline:
                raise RuntimeError(f"rank exporters did not start: {rank_errors}")
            time.sleep(0.2)
        rank_ports = [int(path.read_text()) for path in port_files]

        prometheus = start_prometheus(run_dir, _prometheus_config(rank_ports, service_url),
                                      binary=prometheus_binary, extra_args=["--log.level=warn"])
        live = Stack(prometheus.url, service_url, rank_ports, run_dir)

        def ready() -> bool:
            if rank_errors:
                pytest.fail(f"a rank failed: {rank_errors[0]}")
            scrapes = live.values('min(count_over_time(moe_a2a_info[1m]))')
            return (
                len(live.query('up{job="capwatch-ranks"} == 1')) == EP_SIZE + DEEPEP_EP_SIZE
                and len(live.query('up{job="capwatch-service"} == 1')) == 1
                and scrapes.get("", 0) >= 8  # 8 scrapes of every rank: each 10s window holds several samples
                and all(live.query(f'{service_metrics.RECOMMENDED_CAP_TOKENS}{{ep_group="{cluster}"}}')
                        for cluster in (CLUSTER, DEEPEP_CLUSTER))
                and len(live.query('ALERTS{alertname="MoeA2AOverflow", alertstate="firing"}')) == 2
            )

        _wait_for(ready, "ranks and service scraped, a recommendation and the overflow alert", live)
        yield live
    finally:
        (run_dir / "stop").touch()
        for thread in ranks_threads:
            thread.join(timeout=60)
        if prometheus is not None:
            prometheus.stop()
        if service is not None:
            service.stop()


def _dashboard_queries(committed_dashboards: dict, ep_rank: str = ".+", cluster: str = CLUSTER
                       ) -> list[tuple[str, str]]:
    values = {"ep_group": cluster, "dispatcher": ".+", "ep_rank": ep_rank}
    queries = []
    for file_name, dashboard in committed_dashboards.items():
        for panel, target in lint.targets(dashboard):
            expr = lint.substitute_variables(target["expr"].replace("$__rate_interval", RATE_INTERVAL), values)
            queries.append((f"{file_name} / {panel['title']} / {target['refId']}", expr))
    return queries


@pytest.mark.parametrize("cluster", [CLUSTER, DEEPEP_CLUSTER])
def test_every_dashboard_query_returns_data(stack, committed_dashboards, cluster):
    queries = _dashboard_queries(committed_dashboards, cluster=cluster)
    assert len(queries) > 30
    empty = [f"{where}: {expr}" for where, expr in queries if not stack.query(expr)]
    assert empty == [], "queries without data:\n" + "\n".join(empty)


def test_annotations_run_on_the_real_prometheus_and_mark_the_overflows(stack, committed_dashboards):
    """Each annotation's query, as Grafana sends it over the dashboard's range (a subquery here): the overflows of
    both groups are marked; no cap changed and no rank restarted in this run, so those two mark nothing."""
    for dashboard in committed_dashboards.values():
        for annotation in lint.annotation_queries(dashboard):
            expr = lint.substitute_variables(annotation["expr"].replace("$__rate_interval", RATE_INTERVAL),
                                             {"ep_group": ".+", "dispatcher": ".+", "ep_rank": ".+"})
            marked = {sample["metric"]["ep_group"] for sample in stack.query(f"max_over_time(({expr})[10m:5s])")}
            expected = {CLUSTER, DEEPEP_CLUSTER} if annotation["name"] == "Overflows" else set()
            assert marked == expected, (annotation["name"], expr)


def test_rank_selection_narrows_every_per_rank_panel(stack, committed_dashboards):
    """Picking ranks 1 and 3 (Grafana sends a multi-value selection as a regex group) leaves only them."""
    per_rank = [(where, expr) for where, expr in _dashboard_queries(committed_dashboards, ep_rank="(1|3)")
                if lint.keeps_rank(expr.replace('ep_rank=~"(1|3)"', 'ep_rank=~"$ep_rank"'))]
    assert len(per_rank) > 10
    for where, expr in per_rank:
        assert {sample["metric"]["ep_rank"] for sample in stack.query(expr)} == {"1", "3"}, where


def test_variable_queries_list_the_run(stack, committed_dashboards):
    dashboard = next(iter(committed_dashboards.values()))
    found = {}
    for variable in lint.query_variables(dashboard):
        selector = lint.substitute_variables(lint.variable_selector(variable["query"]), {"ep_group": CLUSTER})
        label = variable["query"].rsplit(",", 1)[1].strip(" )")
        url = f"{stack.prometheus_url}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
        found[variable["name"]] = sorted(_get_json(url)["data"])
    assert CLUSTER in found["ep_group"]
    assert found["dispatcher"] == ["target"]
    assert found["ep_rank"] == [str(rank) for rank in range(EP_SIZE)]


def test_every_recording_rule_returns_data_and_every_rule_evaluates(stack, rule_file):
    records = [rule["record"] for group in rule_file["groups"] for rule in group["rules"] if "record" in rule]
    empty = [(record, cluster) for record in records for cluster in (CLUSTER, DEEPEP_CLUSTER)
             if not stack.query(f'{record}{{ep_group="{cluster}"}}')]
    assert empty == []
    groups = _get_json(f"{stack.prometheus_url}/api/v1/rules")["data"]["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert len(loaded) == sum(len(group["rules"]) for group in rule_file["groups"])
    assert [(rule["name"], rule.get("lastError")) for rule in loaded if rule["health"] != "ok"] == []


def test_values_agree_with_the_run(stack):
    """The numbers behind the panels are the run's: 4 ranks at cap 64, FlashInfer's workspace formula."""
    assert stack.values(f'moe_a2a_cap_tokens{{ep_group="{CLUSTER}"}}') == {str(r): e2e_rank.CAP for r in range(EP_SIZE)}
    per_rank = workspace_bytes_per_rank(
        EP_SIZE, e2e_rank.CAP, dispatch_bytes_per_token(e2e_rank.HIDDEN, e2e_rank.TOP_K, "fp16"),
        combine_bytes_per_token(e2e_rank.HIDDEN))
    group = stack.values(f'ep_group_dispatcher:moe_a2a_workspace_bytes:sum{{ep_group="{CLUSTER}"}}')
    assert group == {"": EP_SIZE * per_rank}
    assert stack.values(f'ep_group_dispatcher:moe_a2a_info:count{{ep_group="{CLUSTER}"}}') == {"": EP_SIZE}
    # The ranks step together: every rank's step rate is positive and the group rate is their sum.
    steps = stack.values(f'rate(moe_a2a_forward_steps_total{{ep_group="{CLUSTER}"}}[{RATE_INTERVAL}])')
    assert len(steps) == EP_SIZE and all(rate > 0 for rate in steps.values())
    # Only the chunked runtime_over_cap path overflows in this run.
    overflows = stack.query(f'sum by (kind, outcome) (moe_a2a_overflow_events_total{{ep_group="{CLUSTER}"}}) > 0')
    assert [(s["metric"]["kind"], s["metric"]["outcome"]) for s in overflows] == [("runtime_over_cap", "chunked")]
    peak = stack.values(f'ep_group_dispatcher:moe_a2a_interval_peak_utilization_ratio:max{{ep_group="{CLUSTER}"}}')
    assert 0 < peak[""] <= 1.25
    # Every peak window (60 s) holds over-cap steps (one in 15): the window gauge shows an overflow, always.
    window = stack.values(
        f'ep_group_dispatcher:moe_a2a_runtime_tokens_window_utilization_ratio:max{{ep_group="{CLUSTER}"}}')
    assert 1 < window[""] <= 1.25
    # The service's recommendation, as scraped, lies within its own bounds and above the overflowing cap.
    advice = {name: stack.values(f'{name}{{ep_group="{CLUSTER}"}}')[""] for name in (
        service_metrics.RECOMMENDED_CAP_LOWER_TOKENS, service_metrics.RECOMMENDED_CAP_TOKENS,
        service_metrics.RECOMMENDED_CAP_UPPER_TOKENS, service_metrics.CLUSTER_CAP_TOKENS)}
    assert advice[service_metrics.CLUSTER_CAP_TOKENS] == e2e_rank.CAP
    assert (advice[service_metrics.RECOMMENDED_CAP_LOWER_TOKENS] <= advice[service_metrics.RECOMMENDED_CAP_TOKENS]
            <= advice[service_metrics.RECOMMENDED_CAP_UPPER_TOKENS])
    assert advice[service_metrics.RECOMMENDED_CAP_TOKENS] > e2e_rank.CAP


def test_the_deepep_group_is_priced_and_advised_as_deepep(stack):
    """The same rules and service over the DeepEP group: its buffer, its variable, a cap within DeepEP's rules."""
    plan = plan_deepep_buffer(custom_geometry(e2e_rank.DEEPEP_HIDDEN, e2e_rank.TOP_K, e2e_rank.NUM_EXPERTS),
                              DEEPEP_EP_SIZE, e2e_rank.CAP, "low_latency")
    group = stack.values(f'ep_group_dispatcher:moe_a2a_workspace_bytes:sum{{ep_group="{DEEPEP_CLUSTER}"}}')
    assert group == {"": DEEPEP_EP_SIZE * plan.buffer_bytes_per_rank}
    [variable] = stack.query(f'ep_group_dispatcher:moe_a2a_info_cap_variable:topk1{{ep_group="{DEEPEP_CLUSTER}"}}')
    assert variable["metric"]["cap_variable"] == DEEPEP.cap_env_var
    recommended = stack.values(f'{service_metrics.RECOMMENDED_CAP_TOKENS}{{ep_group="{DEEPEP_CLUSTER}"}}')[""]
    assert recommended % 128 == 0 and e2e_rank.CAP < recommended <= 1024
    alerts = _get_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
    overflow = {alert["labels"]["ep_group"]: alert for alert in alerts if alert["labels"]["alertname"] == "MoeA2AOverflow"}
    assert overflow[DEEPEP_CLUSTER]["labels"]["cap_variable"] == DEEPEP.cap_env_var
    assert DEEPEP.cap_env_var in overflow[DEEPEP_CLUSTER]["annotations"]["description"]
    assert FLASHINFER.cap_env_var in overflow[CLUSTER]["annotations"]["description"]


def test_alerts_match_the_run(stack):
    """The overflow alert fires for the chunked overflows; nothing claims a missing rank or a mismatch."""
    alerts = _get_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
    active = {(alert["labels"]["alertname"], alert["labels"].get("kind"), alert["labels"].get("outcome"))
              for alert in alerts if alert["labels"].get("ep_group", CLUSTER) == CLUSTER}
    assert ("MoeA2AOverflow", "runtime_over_cap", "chunked") in active
    quiet = {"MoeA2ARankMissing", "MoeA2ARankDown", "MoeA2ACapMismatch", "MoeA2AEpSizeMismatch"}
    assert {name for name, _, _ in active} & quiet == set()


def test_every_named_metric_is_scraped(stack):
    """The names the dashboards and rules rely on exist in the real scrape (a rename on either side fails)."""
    scraped = set(_get_json(f"{stack.prometheus_url}/api/v1/label/__name__/values")["data"])
    expected = set(service_metrics.SERVICE_METRICS) - {service_metrics.INGEST_LATENCY_SECONDS}
    expected.add(service_metrics.INGEST_LATENCY_SECONDS + "_count")
    # Absent where the rank leaves the field unset, as these ranks (no SGLang, no CUDA graphs) do.
    unset = {catalogue.CUDA_GRAPH_MAX_BATCH_SIZE, *catalogue.ENGINE_METRICS["sglang"].metrics}
    # A backend's own series exist only on its ranks: the stack runs FlashInfer's and DeepEP's.
    unset |= {metric for name, backend in catalogue.BACKEND_METRICS.items()
              if name not in (FLASHINFER.name, DEEPEP.name) and not backend.on_shared_series
              for metric in backend.metrics}
    # The bytes a FlashInfer 0.7.4 object reports as built: these ranks run an older FlashInfer, or none.
    unset |= {metric for metric in catalogue.BACKEND_METRICS[FLASHINFER.name].metrics
              if metric.name.endswith("_built_workspace_bytes")}
    for spec in catalogue.METRICS:
        if spec is catalogue.WORKSPACE_ALLOCATED_BYTES:
            continue  # only where the backend knows its allocation; the torch backend does not
        if spec in unset:
            continue
        expected.add(spec.name + "_bucket" if spec.type == "histogram" else spec.name)
    assert sorted(expected - scraped) == []


def test_a_lost_rank_is_reported_missing_and_down(stack):
    """Runs last: one rank's exporter stops answering. Prometheus marks its series stale, so MoeA2ARankMissing
    (3 of ep_size 4) and MoeA2ARankDown (its failed scrape) go pending at once (both wait 1m to fire)."""
    victim = EP_SIZE - 1
    (stack.logs / f"rank{victim}.close-exporter").touch()
    instance = f"127.0.0.1:{stack.rank_ports[victim]}"

    def pending() -> bool:
        missing = stack.query(f'ALERTS{{alertname="MoeA2ARankMissing", ep_group="{CLUSTER}", ep_size="{EP_SIZE}"}}')
        down = stack.query(f'ALERTS{{alertname="MoeA2ARankDown", instance="{instance}"}}')
        # The recording rules live in another group, evaluated on their own tick.
        counted = stack.values(f'ep_group_dispatcher:moe_a2a_info:count{{ep_group="{CLUSTER}"}}')
        return bool(missing) and bool(down) and counted == {"": EP_SIZE - 1}

    _wait_for(pending, "MoeA2ARankMissing and MoeA2ARankDown after a rank stopped exporting", stack, timeout_s=30)
    alerts = _get_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
    missing = next(alert for alert in alerts if alert["labels"]["alertname"] == "MoeA2ARankMissing")
    assert float(missing["value"]) == EP_SIZE - 1 and missing["state"] == "pending"
    down = next(alert for alert in alerts if alert["labels"]["alertname"] == "MoeA2ARankDown")
    assert down["labels"]["instance"] == instance and down["state"] == "pending"
