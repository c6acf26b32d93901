"""Real EP groups: gloo rank processes dispatching through InstrumentedDispatcher, each with
its exporter and reporter; Prometheus' own linter on the live /metrics; a real HTTP peer as
the service, taken down, hung and brought back."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from capwatch.demo.ranks import RankFailedError
from capwatch.telemetry.catalogue import RUNTIME_TOKEN_BUCKETS
from tests.support.prometheus import scrape_config, start_prometheus

from .group import RankGroup
from .promtool import promtool_findings
from .rank_program import RankPlan
from .sink import ReportSink
from .workload import Workload, expected_totals

WORKLOAD = Workload()
RANK_LABELS = ("ep_group", "ep_rank", "dispatcher")


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return response.read()


def samples(exposition: bytes) -> dict[tuple, float]:
    """{(sample name, sorted labels without the rank labels): value}."""
    return {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k not in RANK_LABELS))): sample.value
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
    }


def check_reports_exactly_once(sink: ReportSink, statuses: list[dict]) -> None:
    """Per rank: one boot, sequences 0..n, one final report last, intervals adding up to the run."""
    ep_size = len(statuses)
    expected = expected_totals(WORKLOAD, ep_size, range(statuses[0]["step"]))
    for status in statuses:
        boots = sink.boots_of(status["rank"])
        reports = boots[status["boot_id"]]
        assert [r.sequence for r in reports] == list(range(status["reporter"]["next_sequence"]))
        assert reports[-1].final and [r.final for r in reports].count(True) == 1
        histogram: dict[int, int] = {}
        for report in reports:
            for runtime_tokens, steps in report.interval.runtime_tokens_histogram:
                histogram[runtime_tokens] = histogram.get(runtime_tokens, 0) + steps
        assert histogram == expected.runtime_tokens_histogram
        assert sum(r.interval.forward_steps for r in reports) == expected.forward_steps
        assert sum(r.interval.dispatch_calls for r in reports) == expected.dispatch_calls
        final = reports[-1].counters
        assert final.tokens_sent == expected.tokens_sent[status["rank"]]
        assert final.tokens_received == expected.tokens_received[status["rank"]]
        assert max(r.interval.peak_runtime_tokens for r in reports) == expected.max_runtime_tokens


@pytest.fixture(scope="module")
def sink():
    sink = ReportSink().start()
    yield sink
    sink.release.set()
    sink.stop()


@pytest.fixture(scope="module")
def group4(sink):
    group = RankGroup(4, RankPlan(cluster="live4", service_url=sink.url))
    yield group
    group.close()


def test_promtool_finds_nothing_in_the_live_metrics_of_every_rank(group4):
    group4.command("steps", 10)
    group4.start_running()
    try:
        while_dispatching = [scrape(url) for url in group4.metrics_urls]
    finally:
        group4.stop_running()
    for exposition in while_dispatching:
        assert b"moe_a2a_runtime_tokens_bucket" in exposition
        assert promtool_findings(exposition) == []


def test_exported_values_equal_what_was_dispatched(group4):
    statuses = group4.command("steps", 25)
    steps = range(statuses[0]["step"])
    expected = expected_totals(WORKLOAD, 4, steps)
    for rank, status in enumerate(statuses):
        exported = samples(scrape(status["metrics_url"]))
        snapshot = status["snapshot"]
        # ... equal to the rank's own counters ...
        assert exported[("moe_a2a_forward_steps_total", ())] == snapshot["forward_steps"]
        assert exported[("moe_a2a_dispatch_calls_total", ())] == snapshot["dispatch_calls"]
        assert exported[("moe_a2a_tokens_sent_total", ())] == snapshot["tokens_sent"]
        assert exported[("moe_a2a_tokens_received_total", ())] == snapshot["tokens_received"]
        # ... and to the workload, computed without the dispatcher.
        assert snapshot["forward_steps"] == expected.forward_steps
        assert exported[("moe_a2a_dispatch_calls_total", ())] == expected.dispatch_calls
        assert exported[("moe_a2a_tokens_sent_total", ())] == expected.tokens_sent[rank]
        assert exported[("moe_a2a_tokens_received_total", ())] == expected.tokens_received[rank]
        assert exported[("moe_a2a_runtime_tokens_max", ())] == expected.max_runtime_tokens
        assert exported[("moe_a2a_cap_tokens", ())] == WORKLOAD.cap
        for bound in RUNTIME_TOKEN_BUCKETS:
            steps_at_most = sum(n for r, n in expected.runtime_tokens_histogram.items() if r <= bound)
            assert exported[("moe_a2a_runtime_tokens_bucket", (("le", floatToGoString(bound)),))] == steps_at_most
        assert exported[("moe_a2a_runtime_tokens_count", ())] == expected.forward_steps
        assert exported[("moe_a2a_runtime_tokens_sum", ())] == sum(
            r * n for r, n in expected.runtime_tokens_histogram.items())
        assert all(exported[("moe_a2a_overflow_events_total", (("kind", kind), ("outcome", outcome)))] == 0
                   for kind in ("runtime_over_cap", "local_over_runtime") for outcome in ("raised", "chunked"))
        info = [key for key in exported if key[0] == "moe_a2a_info"]
        assert info and dict(info[0][1])["ep_size"] == "4" and exported[info[0]] == 1
    assert sum(expected.tokens_sent) == sum(expected.tokens_received) > 0


def test_a_real_prometheus_scrapes_every_rank_and_sums_add_up(group4, tmp_path):
    targets = [url.split("//")[1].split("/")[0] for url in group4.metrics_urls]
    prometheus = start_prometheus(tmp_path, scrape_config(targets))
    try:
        steps = group4.command("steps", 5)[0]["step"]
        expected = expected_totals(WORKLOAD, 4, range(steps))
        prometheus.wait_for('sum(up{job="capwatch-ranks"})', lambda result: result and result[0]["value"][1] == "4")
        selector = '{ep_group="live4", dispatcher="target"}'
        sent = prometheus.wait_for(
            f"sum(moe_a2a_tokens_sent_total{selector})",
            lambda result: result and float(result[0]["value"][1]) == sum(expected.tokens_sent))
        assert sent
        received = prometheus.query(f"sum(moe_a2a_tokens_received_total{selector})")
        assert float(received[0]["value"][1]) == sum(expected.tokens_received)
        per_rank = prometheus.query(f"moe_a2a_forward_steps_total{selector}")
        assert sorted(item["metric"]["ep_rank"] for item in per_rank) == ["0", "1", "2", "3"]
        assert all(float(item["value"][1]) == steps for item in per_rank)
        # The cap-fitted buckets work with histogram_quantile: the median R lies within the cap.
        median = prometheus.query(f"histogram_quantile(0.5, sum by (le) (moe_a2a_runtime_tokens_bucket{selector}))")
        assert 0 < float(median[0]["value"][1]) <= WORKLOAD.cap
        # Every step ran within the peak window: its largest R reached Prometheus, whatever was sampled.
        window_max = prometheus.query(f"max(moe_a2a_runtime_tokens_window_max{selector})")
        assert float(window_max[0]["value"][1]) == expected.max_runtime_tokens
    finally:
        prometheus.stop()


def test_scrape_under_load_never_blocks_dispatch(group4):
    """Four scrapers hammer every rank while one more connection per rank stalls half-way through a
    request; the forward-step counter keeps moving between scrapes all along."""
    stalled = []
    for url in group4.metrics_urls:
        host, port = url.split("//")[1].split("/")[0].split(":")
        connection = socket.create_connection((host, int(port)), timeout=10)
        connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        stalled.append(connection)
    seen: dict[tuple[int, int], list[float]] = {(scraper, rank): [] for scraper in range(4) for rank in range(4)}
    failures: list[BaseException] = []
    done = threading.Event()

    def hammer(scraper: int) -> None:
        try:
            while not done.is_set():
                for rank, url in enumerate(group4.metrics_urls):
                    seen[scraper, rank].append(samples(scrape(url))[("moe_a2a_forward_steps_total", ())])
        except BaseException as error:  # noqa: BLE001 (reported below)
            failures.append(error)

    before = group4.status[0]["step"]
    group4.start_running()
    scrapers = [threading.Thread(target=hammer, args=(scraper,)) for scraper in range(4)]
    for thread in scrapers:
        thread.start()
    def progressed() -> bool:
        """Every scraper saw every rank move a few times, and rank 0 move more than 10 steps: what is asserted
        below, waited for (how many steps fit between scrapes depends on the machine's load)."""
        first_scraper = seen[0, 0]
        return min(len(set(v)) for v in seen.values()) >= 3 and first_scraper[-1] - first_scraper[0] > 10

    deadline = time.monotonic() + 90
    while not failures and time.monotonic() < deadline and not progressed():
        time.sleep(0.2)
    done.set()
    for thread in scrapers:
        thread.join(timeout=60)
    statuses = group4.stop_running()
    for connection in stalled:
        connection.close()
    assert not failures
    assert statuses[0]["step"] - before > 10
    for (scraper, rank), values in seen.items():
        assert values == sorted(values), f"scraper {scraper} saw rank {rank}'s counter go backwards"
        assert len(set(values)) >= 3, f"rank {rank}: dispatch did not progress between scrapes: {values}"


def test_every_report_arrives_exactly_once(group4, sink):
    statuses = group4.exit()
    check_reports_exactly_once(sink, statuses)
    assert sink.invalid == []


def test_dead_then_hanging_service_costs_the_ranks_nothing_and_loses_no_report():
    sink = ReportSink().start()
    group = RankGroup(2, RankPlan(cluster="outage", service_url=sink.url, interval_s=0.1, max_pending_reports=8))
    try:
        group.command("steps", 15)
        deadline = time.monotonic() + 60
        while len(sink.by_boot()) < 2:
            assert time.monotonic() < deadline, "no reports from both ranks"
            time.sleep(0.05)

        sink.stop()  # dead: connection refused
        at_outage = group.status[0]["step"]
        down = group.command("steps", 60)  # a fixed amount of work: it would hang if dispatch waited
        assert down[0]["step"] - at_outage == 60
        for _ in range(15):  # 15 intervals, cut explicitly, pile up behind the dead service
            group.command("steps", 4)
            down = group.command("cut")
        deadline = time.monotonic() + 60
        while not all(status["reporter"]["send_failures"] > 0 for status in down):
            assert time.monotonic() < deadline, f"no failed send seen: {[s['reporter'] for s in down]}"
            down = group.command("steps", 1)
        for status in down:
            assert status["reporter"]["pending"] == 8  # full and bounded: merged, not grown
            assert status["reporter"]["delivered"] == len(sink.boots_of(status["rank"])[status["boot_id"]])

        sink.hang.set()  # back, but every request hangs: the reporters are stuck inside a POST
        sink.start()
        hung = group.command("steps", 40)
        assert hung[0]["step"] == down[0]["step"] + 40
        assert all(status["reporter"]["pending"] >= 1 for status in hung)

        sink.release.set()
        sink.hang.clear()
        statuses = group.exit()
        check_reports_exactly_once(sink, statuses)
        assert sink.invalid == []
    finally:
        group.close()
        sink.release.set()
        sink.stop()


def test_overflow_sends_a_final_report_before_the_rank_dies_and_a_restart_starts_a_new_boot():
    sink = ReportSink().start()
    plan = RankPlan(cluster="crash", service_url=sink.url, interval_s=60)
    group = RankGroup(2, plan)
    try:
        first = group.command("steps", 12)
        group.send("overflow", 5)
        with pytest.raises(RankFailedError, match="CapOverflowError"):
            group.result.result(timeout=120)
        for status in first:
            (reports,) = sink.boots_of(status["rank"]).values()
            final = reports[-1]
            assert final.final and final.identity.boot_id == status["boot_id"]
            assert "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK" in final.final_reason
            assert [(e.kind, e.outcome, e.count) for e in final.counters.overflow_events] == [
                ("runtime_over_cap", "raised", 1)]
            assert final.counters.forward_steps == 13  # the overflowing step was counted, too
            assert (WORKLOAD.cap + 1, 1) in final.interval.runtime_tokens_histogram
            assert final.interval.peak_runtime_tokens == WORKLOAD.cap + 5
    finally:
        group.close()

    restarted = RankGroup(2, plan)
    try:
        statuses = restarted.command("steps", 3)
        statuses = restarted.exit()
        for old, new in zip(first, statuses):
            assert new["boot_id"] != old["boot_id"]
            boots = sink.boots_of(new["rank"])
            assert len(boots) == 2
            reports = boots[new["boot_id"]]
            assert reports[0].sequence == 0
            assert reports[-1].counters.forward_steps == 3  # counters restart from zero with the boot
    finally:
        restarted.close()
        sink.stop()
