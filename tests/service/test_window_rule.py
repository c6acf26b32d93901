"""The window rule (``advisor/sample.py``) is defined once and run four ways; one table of cases holds the
four equal: the Python (``group_samples``), a real SQLite store (the cases' reports ingested, its windows
table read back: the SQL derived from ``WINDOW_FIELDS``), a real Prometheus (the ranks' series written
into its TSDB with ``promtool tsdb create-blocks-from openmetrics``, read by the Prometheus source's
PromQL, derived from the same fields) and the log reader (the cases as SGLang's decode lines and overflow
assertions, read by ``capwatch.sglang_logs``: its timeline applies the rule to each window).

The series stand for what each rank's exporter shows at a scrape every second: the forward-step and
overflow counters (from zero at each boot), the cap, and the window's largest R so far.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import DEFAULT_POLICY
from capwatch.advisor.sample import SUM_LIMIT, WINDOW_FIELDS, RankInterval, combined, group_samples
from capwatch.sglang_logs.reader import read_logs
from capwatch.service.config import Settings
from capwatch.service.sources.prometheus.source import PrometheusSource
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.schema import MIGRATIONS, upsert_windows_sql
from capwatch.service.store.sqlite import Store
from capwatch.service.store.windows import read_windows
from capwatch.telemetry import catalogue
from capwatch.telemetry.report import RankReport
from tests.service.conftest import T0, FakeClock
from tests.support import sglang_logs as sg
from tests.support.prometheus import scrape_config, start_prometheus
from tests.support.simulate import SimulatedRank

WINDOW_S = 10.0  # T0 is a multiple of it: window k starts at T0 + k * WINDOW_S
EP_SIZE = 4


@dataclass(frozen=True)
class Interval:
    """One rank's interval: it ends in window ``window`` (the ``order``-th of the rank's in that window)."""

    rank: int
    window: int
    peak: int
    cap: int
    steps: int = 3
    overflows: int = 0  # runtime_over_cap events (counted by the rule)
    other_overflows: int = 0  # local_over_runtime events (not counted)
    boot: int = 0  # a higher boot: the rank restarted at the start of this window (its counters from zero)
    order: int = 0

    @property
    def end_s(self) -> float:
        return T0 + self.window * WINDOW_S + 2.0 + 3.0 * self.order  # between the scrapes at .5 s


@dataclass(frozen=True)
class Case:
    name: str
    intervals: tuple[Interval, ...]
    expected: tuple[tuple[int, int, int, int], ...]  # (window, peak, cap, overflow events), oldest first


CASES = (
    Case("one-rank", (Interval(0, 1, 300, 512),), ((1, 300, 512, 0),)),
    Case("hottest-peak-largest-cap",
         (Interval(0, 1, 300, 512), Interval(1, 1, 450, 256), Interval(2, 1, 100, 1024)), ((1, 450, 1024, 0),)),
    Case("overflows-summed-over-ranks-and-intervals",
         (Interval(0, 1, 600, 512, overflows=31), Interval(0, 1, 500, 512, overflows=5, order=1),
          Interval(1, 1, 530, 512, overflows=2)), ((1, 600, 512, 38),)),
    Case("other-overflow-kinds-not-counted",
         (Interval(0, 1, 300, 512, other_overflows=7), Interval(1, 1, 520, 512, overflows=1)), ((1, 520, 512, 1),)),
    Case("an-idle-rank-adds-nothing",
         (Interval(0, 1, 300, 512), Interval(1, 1, 900, 2048, steps=0, overflows=4)), ((1, 300, 512, 0),)),
    Case("a-window-of-idle-ranks-has-no-sample",
         (Interval(0, 1, 300, 512), Interval(0, 2, 700, 512, steps=0), Interval(1, 2, 0, 512, steps=0),
          Interval(0, 3, 310, 512)), ((1, 300, 512, 0), (3, 310, 512, 0))),
    Case("windows-apart",
         (Interval(0, 1, 300, 512), Interval(1, 3, 200, 512, overflows=1), Interval(0, 6, 100, 256)),
         ((1, 300, 512, 0), (3, 200, 512, 1), (6, 100, 256, 0))),
    Case("a-restarted-rank-counts-from-zero",
         (Interval(0, 1, 300, 512, steps=9, overflows=6), Interval(0, 2, 200, 512, steps=2, overflows=1, boot=1),
          Interval(1, 2, 250, 512, steps=1)), ((1, 300, 512, 6), (2, 250, 512, 1))),
    Case("a-restart-counting-past-the-old-total",  # 2 -> 0 -> 5 steps: five in the window, not three
         (Interval(0, 1, 300, 512, steps=2, overflows=1), Interval(0, 2, 200, 512, steps=5, overflows=3, boot=1)),
         ((1, 300, 512, 1), (2, 200, 512, 3))),
    Case("a-cap-change-between-windows",
         (Interval(0, 1, 400, 512), Interval(0, 2, 400, 1024, boot=1), Interval(1, 2, 100, 1024)),
         ((1, 400, 512, 0), (2, 400, 1024, 0))),
)


def _as_rule_input(interval: Interval) -> RankInterval:
    return RankInterval(interval.rank, interval.end_s, interval.peak, interval.cap, interval.overflows, interval.steps)


def _found(samples) -> list[tuple[int, int, int, int]]:
    return [(round((sample.window_start_s - T0) / WINDOW_S), sample.peak_runtime_tokens, sample.cap,
             sample.overflow_events) for sample in samples]


# --- the reports the cases' ranks send, for the store ----------------------------------------------------


def _reports(cluster: str, intervals: tuple[Interval, ...]) -> list[RankReport]:
    reports = []
    for rank in sorted({interval.rank for interval in intervals}):
        mine = sorted((item for item in intervals if item.rank == rank), key=lambda item: item.end_s)
        boot, sequence, steps, peak, overflows = None, 0, 0, 0, {}
        for interval in mine:
            if interval.boot != boot:  # a new process: counters from zero
                boot, sequence, steps, peak, overflows = interval.boot, 0, 0, 0, {}
            events = {kind: count for kind, count in (("runtime_over_cap", interval.overflows),
                                                      ("local_over_runtime", interval.other_overflows)) if count}
            steps += interval.steps
            peak = max(peak, interval.peak)
            for kind, count in events.items():
                overflows[kind] = overflows.get(kind, 0) + count
            config = SimulatedRank(cluster, rank, EP_SIZE, cap=interval.cap).config()
            reports.append(RankReport.model_validate({
                "identity": {"cluster": cluster, "ep_rank": rank, "ep_size": EP_SIZE, "boot_id": f"boot{boot}"},
                "sequence": sequence, "sent_unix_s": interval.end_s, "config": config,
                "counters": {"dispatch_calls": steps, "forward_steps": steps, "tokens_sent": 0, "tokens_received": 0,
                             "max_runtime_tokens": peak,
                             "overflow_events": [{"kind": kind, "outcome": "raised", "count": count}
                                                 for kind, count in sorted(overflows.items())]},
                "interval": {"start_unix_s": interval.end_s - 2.0, "end_unix_s": interval.end_s,
                             "forward_steps": interval.steps, "dispatch_calls": interval.steps,
                             "peak_runtime_tokens": interval.peak,
                             "runtime_tokens_histogram": ([[min(interval.peak, interval.cap + 1), interval.steps]]
                                                          if interval.steps else []),
                             "overflow_events": [{"kind": kind, "outcome": "raised", "count": count}
                                                 for kind, count in sorted(events.items())]},
            }, strict=False))
            sequence += 1
    return reports


# --- the series the cases' ranks export, for Prometheus --------------------------------------------------


def _exposition(cluster: str, intervals: tuple[Interval, ...]) -> dict[str, list[str]]:
    """OpenMetrics sample lines by family: each rank scraped every second from window 0 (its counters at
    zero) to two windows past its last interval."""
    families: dict[str, list[str]] = {}
    last_window = max(interval.window for interval in intervals) + 2
    for rank in sorted({interval.rank for interval in intervals}):
        mine = sorted((item for item in intervals if item.rank == rank), key=lambda item: item.end_s)
        labels = f'ep_group="{cluster}",ep_rank="{rank}",dispatcher="target"'
        boots = {item.boot: T0 + item.window * WINDOW_S for item in reversed(mine)}  # boot -> when it started
        cap = mine[0].cap
        for second in range(int(last_window * WINDOW_S)):
            at = T0 + second + 0.5
            window = int(second // WINDOW_S)
            boot = max(boot for boot, started in boots.items() if started <= at or boot == mine[0].boot)
            done = [item for item in mine if item.end_s <= at and item.boot == boot]
            here = [item for item in mine if item.window == window]
            cap = next((item.cap for item in reversed(here) if item.end_s <= at), here[0].cap if here else cap)
            peak = max((item.peak for item in here if item.end_s <= at), default=0)
            values = {
                catalogue.CAP_TOKENS.name: (labels, cap),
                catalogue.RUNTIME_TOKENS_WINDOW_MAX.name: (labels, peak),
                catalogue.FORWARD_STEPS.name: (labels, sum(item.steps for item in done)),
            }
            for kind, field in (("runtime_over_cap", "overflows"), ("local_over_runtime", "other_overflows")):
                values[f"{catalogue.OVERFLOW_EVENTS.name}|{kind}"] = (
                    f'{labels},kind="{kind}",outcome="raised"', sum(getattr(item, field) for item in done))
            for name, (series_labels, value) in values.items():
                families.setdefault(name.split("|")[0], []).append(
                    f"{name.split('|')[0]}{{{series_labels}}} {value} {at}")
    return families


def _openmetrics(families: dict[str, list[str]]) -> str:
    lines = []
    for name, samples in families.items():
        spec = next(spec for spec in catalogue.METRICS if spec.name == name)
        family = name.removesuffix("_total") if spec.type == "counter" else name
        lines.append(f"# TYPE {family} {spec.type}")
        # One series after another, each in time order (what promtool's backfill reads).
        lines.extend(sorted(samples, key=lambda line: (line.split("}")[0], float(line.rsplit(" ", 1)[1]))))
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus_source(tmp_path_factory):
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("needs prometheus and promtool (make system-deps)")
    workdir = tmp_path_factory.mktemp("window-rule-prometheus")
    families: dict[str, list[str]] = {}
    for case in CASES:
        for name, samples in _exposition(case.name, case.intervals).items():
            families.setdefault(name, []).extend(samples)
    (workdir / "series.om").write_text(_openmetrics(families))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(workdir / "series.om"),
                    str(workdir / "tsdb")], check=True, capture_output=True, timeout=120)
    with start_prometheus(workdir, scrape_config([], job="nothing")) as server:
        source = PrometheusSource(server.url, Settings(prometheus_url=server.url, window_s=WINDOW_S,
                                                       prometheus_cache_s=0.0))
        yield source
        source.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("window-rule-store") / "capwatch.db",
                  StoreOptions(window_s=WINDOW_S, maintenance_interval_s=3600.0), FakeClock(T0 + 3600))
    for case in CASES:
        for report in _reports(case.name, case.intervals):
            assert store.ingest(report, received_unix_s=report.interval.end_unix_s + 1).accepted
    yield store
    store.close()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_window_rule_is_the_same_in_python_sqlite_and_prometheus(case, store, prometheus_source):
    expected = list(case.expected)
    assert _found(group_samples((_as_rule_input(item) for item in case.intervals), WINDOW_S)) == expected
    assert _found(read_windows(store._reader(), case.name, "target")) == expected
    last = max(interval.window for interval in case.intervals)
    windows = prometheus_source.group_windows(case.name, "target", T0 + WINDOW_S, T0 + (last + 3) * WINDOW_S)
    assert _found(windows) == expected


# --- the log reader: the cases as SGLang writes them --------------------------------------------------------

LOG = sg.FORMAT["sglang-0.5.19+"]
LOG_CAP = 512  # a log shows one cap (here --cap): the cases' caps are not in it


def _as_logged(interval: Interval) -> Interval:
    """What a log can show of an interval: one decode line (``#running-req`` = its peak, 0 when it ran no step)
    and one assertion per overflow at the log's cap, each needing more than that cap. An idle rank logs no
    assertion (an assertion is a step that overflowed)."""
    overflows = interval.overflows if interval.steps else 0
    peak = max(interval.peak, LOG_CAP + 1) if overflows else interval.peak
    return Interval(interval.rank, interval.window, peak if interval.steps else 0, LOG_CAP, interval.steps,
                    overflows, order=interval.order)


def _log_lines(intervals: tuple[Interval, ...]) -> list[str]:
    lines = LOG.start(T0 - 30)
    for interval in sorted(intervals, key=lambda item: item.end_s):
        rank = sg.Rank(dp=interval.rank, tp=interval.rank, ep=interval.rank)
        lines += LOG.decode(interval.end_s, interval.peak, rank)
        for _ in range(interval.overflows):
            lines += LOG.record(interval.end_s, sg.overflow_traceback(interval.peak, interval.cap), rank)
    return lines


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_log_reader_applies_the_same_window_rule(case, tmp_path):
    logged = tuple(_as_logged(interval) for interval in case.intervals)
    path = tmp_path / "server.log"
    path.write_text("\n".join(_log_lines(logged)) + "\n")
    read = read_logs([str(path)], window_s=WINDOW_S, cap=LOG_CAP)
    [segment] = [segment for segment in read.segments if segment.history.sample_count]
    expected = SampleHistory(DEFAULT_POLICY.half_life_s, window_s=WINDOW_S).add_all(
        group_samples((_as_rule_input(item) for item in logged), WINDOW_S), DEFAULT_POLICY.bump_factor,
        DEFAULT_POLICY.bump_min_tokens)
    assert segment.history.to_dict() == expected.to_dict()
    assert segment.history.sample_count == len(case.expected)  # the log shows every window the table has
    assert segment.overflow_lines == sum(item.overflows for item in logged)


# --- beyond the table: Python and SQLite over any intervals, and the saturating sum ------------------------

intervals = st.lists(st.builds(
    Interval, rank=st.integers(0, EP_SIZE - 1), window=st.integers(1, 6), peak=st.integers(0, 8192),
    cap=st.sampled_from([128, 512, 4096]), steps=st.integers(0, 3), overflows=st.integers(0, 1 << 40),
    other_overflows=st.integers(0, 3)), min_size=1, max_size=24)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(intervals)
def test_the_store_windows_are_the_python_rule_for_any_intervals(tmp_path_factory, drawn):
    """Any intervals, several per rank and window, idle ones and huge counts included."""
    ordered: list[Interval] = []
    for interval in drawn:  # at most three per rank and window (their ends lie apart in the window)
        taken = sum(item.rank == interval.rank and item.window == interval.window for item in ordered)
        if taken < 3:
            ordered.append(Interval(**{**interval.__dict__, "order": taken}))
    store = Store(tmp_path_factory.mktemp("rule") / "capwatch.db",
                  StoreOptions(window_s=WINDOW_S, maintenance_interval_s=3600.0), FakeClock(T0 + 3600))
    try:
        for report in _reports("any", tuple(ordered)):
            assert store.ingest(report, received_unix_s=T0).accepted
        stored = _found(read_windows(store._reader(), "any", "target"))
    finally:
        store.close()
    assert stored == _found(group_samples((_as_rule_input(item) for item in ordered), WINDOW_S))


def test_the_summed_field_saturates_the_same_in_python_and_sql():
    connection = sqlite3.connect(":memory:")
    for script in MIGRATIONS:
        connection.executescript(script)
    summed = [rule.name for rule in WINDOW_FIELDS if rule.combine == "sum"]
    assert summed == ["overflow_events"]
    rows = [("c", "target", T0, 1, 128, SUM_LIMIT - 5, 1), ("c", "target", T0, 1, 128, 1 << 58, 1)]
    for row in rows:
        connection.execute(upsert_windows_sql(1), row)
    [(stored,)] = connection.execute("SELECT overflow_events FROM windows").fetchall()
    assert stored == combined("sum", SUM_LIMIT - 5, 1 << 58) == SUM_LIMIT
