"""The trailing-window peak: every step's R reaches every scraper, whatever the scrape cadence,
with a reporter cutting intervals much faster than Prometheus scrapes, and with two scrapers."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capwatch.dispatcher.counters import DispatchCounters
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import RankExporter
from capwatch.telemetry.intervals import IntervalTracker, coherent, zero_snapshot
from capwatch.telemetry.peak_window import TrailingPeak
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankIdentity

CAP = 100
WINDOW_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gauges(exporter: RankExporter) -> dict[str, float]:
    return {sample.name: sample.value
            for family in text_string_to_metric_families(exporter.render().decode())
            for sample in family.samples}


@pytest.fixture
def rank():
    counters = DispatchCounters(CAP, 2)
    tracker = IntervalTracker(counters)
    identity = RankIdentity(cluster="unit", ep_rank=0, ep_size=2, boot_id="b0")
    config = rank_config(cap=CAP, ep_size=2, hidden_size=8, top_k=2, num_experts=4, backend="torch")
    clock = Clock()
    exporter = RankExporter(DispatchCollector(tracker, identity, config, peak_window_s=WINDOW_S, clock=clock))
    return counters, tracker, exporter, clock


def test_a_peak_between_slow_scrapes_is_seen_though_the_reporter_cut_many_intervals_since(rank):
    counters, tracker, exporter, clock = rank
    gauges(exporter)
    counters.record_step(90)  # the spike, in the first of three 5 s reporter intervals between two scrapes
    tracker.close()
    for _ in range(2):
        counters.record_step(10)
        tracker.close()
    clock.now += 15
    exported = gauges(exporter)
    assert exported["moe_a2a_interval_peak_runtime_tokens"] == 10  # the last interval only: the spike is lost
    assert exported["moe_a2a_runtime_tokens_window_max"] == 90
    assert exported["moe_a2a_runtime_tokens_window_utilization_ratio"] == 0.9
    assert exported["moe_a2a_peak_window_seconds"] == WINDOW_S


def test_two_scrapers_both_see_a_peak_that_one_of_them_cut(rank):
    counters, _, exporter, clock = rank
    counters.record_step(70)
    clock.now += 3
    first = gauges(exporter)["moe_a2a_runtime_tokens_window_max"]  # scraper A takes the segment with the spike
    clock.now += 7
    second = gauges(exporter)["moe_a2a_runtime_tokens_window_max"]  # scraper B, 7 s later, nothing new since
    assert first == second == 70


def test_the_peak_leaves_the_window_after_its_length_and_later_peaks_replace_it(rank):
    counters, _, exporter, clock = rank
    counters.record_step(80)
    gauges(exporter)
    for _ in range(3):  # scrapes every 15 s: the spike stays visible for the window
        clock.now += 15
        counters.record_step(20)
        assert gauges(exporter)["moe_a2a_runtime_tokens_window_max"] == 80
    clock.now += WINDOW_S + WINDOW_S / 12  # past the window (and its slot)
    counters.record_step(30)
    assert gauges(exporter)["moe_a2a_runtime_tokens_window_max"] == 30
    clock.now += 2 * WINDOW_S  # nothing dispatched for two windows
    assert gauges(exporter)["moe_a2a_runtime_tokens_window_max"] == 0


def test_an_over_cap_step_shows_its_exact_r_and_a_ratio_above_one(rank):
    counters, _, exporter, clock = rank
    counters.record_step(150)
    clock.now += 1
    exported = gauges(exporter)
    assert exported["moe_a2a_runtime_tokens_window_max"] == 150
    assert exported["moe_a2a_runtime_tokens_window_utilization_ratio"] == 1.5


def test_memory_stays_bounded_however_often_it_is_scraped():
    counters = DispatchCounters(CAP, 2)
    window = TrailingPeak(zero_snapshot(CAP, 2, "target", 0.0), window_s=WINDOW_S, slots=12)
    now = 0.0
    for step in range(2000):
        counters.record_step(1 + step % CAP)
        now += 0.25
        window.observe(coherent(counters.snapshot()), now)
    assert len(window._peaks) <= 13
    assert window.peak(now) == CAP


def test_a_stale_snapshot_from_a_slower_concurrent_scrape_adds_nothing():
    counters = DispatchCounters(CAP, 2)
    window = TrailingPeak(zero_snapshot(CAP, 2, "target", 0.0), window_s=WINDOW_S)
    counters.record_step(40)
    older = coherent(counters.snapshot())
    counters.record_step(60)
    window.observe(coherent(counters.snapshot()), 1.0)
    assert window.observe(older, 2.0) == 60  # no error, no negative delta, peak kept


@pytest.mark.parametrize("window_s, slots, message", [
    (0, 12, "positive number of seconds"), (float("nan"), 12, "positive"), (60, 0, "slots must be >= 1")])
def test_bad_window_is_refused(window_s, slots, message):
    with pytest.raises(ValueError, match=message):
        TrailingPeak(zero_snapshot(CAP, 2, "target", 0.0), window_s=window_s, slots=slots)


def test_peak_between_agrees_with_the_interval_peak_of_the_full_histogram_delta():
    from capwatch.telemetry.intervals import interval_between
    from capwatch.telemetry.peak_window import peak_between

    counters = DispatchCounters(CAP, 2)
    previous = coherent(counters.snapshot())
    for runtime_tokens, local_tokens in ((5, 5), (99, 1), (100, 100), (101, 3), (250, 250), (150, 150), (0, 0),
                                         (3, 2), (140, 120)):  # the last: R at its floor, the local max grows
        counters.record_step(runtime_tokens, local_tokens)
        current = coherent(counters.snapshot())
        assert peak_between(previous, current) == interval_between(previous, current).peak_runtime_tokens
        assert peak_between(current, current) == 0
        previous = current


def test_a_snapshot_torn_between_histogram_and_max_keeps_the_exact_overflow_peak():
    """record_step adds to the histogram and then raises the running max: a scrape in between sees the
    over-cap bin grow with the old max, the next one only the new max. The peak must still be exact."""
    from dataclasses import replace

    from capwatch.dispatcher.counters import DispatchCounters
    from capwatch.telemetry.peak_window import peak_between

    counters = DispatchCounters(cap=64, ep_size=2)
    counters.record_step(40)
    before = counters.snapshot()
    counters.record_step(100)
    after = counters.snapshot()
    torn = replace(after, max_runtime_tokens=before.max_runtime_tokens)  # the bin grew, the max not yet
    assert peak_between(before, torn) == 65  # cap + 1: the honest floor so far
    assert peak_between(torn, after) == 100  # the max grew with no new step: its R still counts
    assert peak_between(before, after) == 100
