"""The reporter against a real HTTP peer (tests/telemetry/sink.py), counters driven in this thread."""

import logging
import time

import pytest
import torch
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import RankExporter
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import (
    Delivery,
    HttpReportSender,
    RankReporter,
    ReporterOptions,
    SendResult,
    classify_status,
    new_boot_id,
)
from prometheus_client.parser import text_string_to_metric_families

from .sink import ReportSink

CAP = 32
EP_SIZE = 2


@pytest.fixture
def sink():
    sink = ReportSink().start()
    yield sink
    sink.release.set()
    sink.stop()


def make_reporter(sink: ReportSink, counters: DispatchCounters, sender=None, **options) -> RankReporter:
    identity = RankIdentity(cluster="unit", ep_rank=1, ep_size=EP_SIZE, boot_id=new_boot_id())
    config = rank_config(cap=CAP, ep_size=EP_SIZE, hidden_size=8, top_k=2, num_experts=4, backend="torch")
    # A generous request timeout: on a loaded machine a timed-out POST would be an extra, unplanned retry.
    defaults = dict(service_url=sink.url, interval_s=0.05, backoff_initial_s=0.02, backoff_max_s=0.1,
                    request_timeout_s=15.0)
    return RankReporter(counters, identity, config, ReporterOptions(**(defaults | options)), sender=sender)


def dispatch(counters: DispatchCounters, runtime_tokens: int) -> None:
    counters.record_step(runtime_tokens)
    counters.record_dispatch(torch.tensor([runtime_tokens, 1]), torch.tensor([1, runtime_tokens]))


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.01)


def assert_exactly_once(sink: ReportSink, reporter: RankReporter, counters: DispatchCounters,
                        final_reasons: tuple[str, ...] = ("shutdown",)) -> list:
    """One boot, sequences 0..n without gaps, a final report last, and the intervals add up to the counters."""
    (reports,) = sink.by_boot().values()
    assert [r.sequence for r in reports] == list(range(len(reports))) == list(range(reporter.next_sequence))
    assert reports[-1].final and tuple(r.final_reason for r in reports if r.final) == final_reasons
    snapshot = counters.snapshot()
    histogram: dict[int, int] = {}
    for report in reports:
        for runtime_tokens, steps in report.interval.runtime_tokens_histogram:
            histogram[runtime_tokens] = histogram.get(runtime_tokens, 0) + steps
    assert sum(r.interval.forward_steps for r in reports) == snapshot.forward_steps
    assert sum(r.interval.dispatch_calls for r in reports) == snapshot.dispatch_calls
    assert histogram == {r: n for r, n in enumerate(snapshot.runtime_tokens_histogram) if n}
    assert reports[-1].counters.tokens_sent == snapshot.tokens_sent
    assert max(r.interval.peak_runtime_tokens for r in reports) == snapshot.max_runtime_tokens
    for earlier, later in zip(reports, reports[1:]):
        assert earlier.interval.end_unix_s <= later.interval.start_unix_s + 1e-6
    return reports


def test_reports_arrive_in_order_and_add_up_to_what_was_dispatched(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters).start()
    for step in range(300):
        dispatch(counters, 1 + step % CAP)
        if step % 50 == 49:
            reporter.cut_interval()  # six intervals for sure, besides the ones the 50 ms clock cuts
    assert reporter.close("shutdown", timeout_s=10)
    reports = assert_exactly_once(sink, reporter, counters)
    assert len([r for r in reports if r.interval.forward_steps]) >= 6
    assert reports[-1].final_reason == "shutdown"
    assert sink.duplicates == 0 and reporter.stats().delivered == len(reports)


def test_service_down_costs_memory_bounded_by_merging_and_loses_nothing(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    # The clock never cuts an interval here (an hour); the test cuts every one of them.
    reporter = make_reporter(sink, counters, interval_s=3600, max_pending_reports=4).start()
    dispatch(counters, 3)
    reporter.cut_interval()
    wait_for(lambda: sink.reports)
    sink.stop()
    steps_per_interval = 7
    step = 0
    for _ in range(20):  # 20 intervals while the service is down
        for _ in range(steps_per_interval):
            dispatch(counters, 1 + step % (CAP + 4))  # some steps above the cap, too
            step += 1
        reporter.cut_interval()
        assert reporter.stats().pending <= 4
    wait_for(lambda: reporter.stats().send_failures > 0)
    assert reporter.stats().pending == 4  # full: the 20 went into 4, merged, not dropped
    assert reporter.stats().merged == 20 - 4  # each cut past the bound merged one pair, and says so
    assert exported_reporter_counters(reporter, counters)["moe_a2a_reports_merged_total"] == 20 - 4
    sink.start()  # same port
    assert reporter.close("shutdown", timeout_s=10)
    reports = assert_exactly_once(sink, reporter, counters)
    assert len(reports) <= 1 + 4 + 1  # before the outage, the 4 buffered, the final one
    # Merged reports span several intervals: one holds at least a quarter of the 20.
    assert max(r.interval.forward_steps for r in reports) >= 5 * steps_per_interval


def test_a_lost_response_is_retried_with_the_same_sequence_and_counted_once(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    sink.responses_to_lose = 2
    reporter = make_reporter(sink, counters).start()
    for step in range(50):
        dispatch(counters, 5)
    wait_for(lambda: sink.duplicates >= 2)
    assert reporter.close("shutdown", timeout_s=10)
    assert_exactly_once(sink, reporter, counters)
    assert sink.duplicates == 2
    assert reporter.stats().send_failures >= 2


BROKEN_RESPONSES = [
    # Content-Length promises 100 bytes, 11 come: http.client.IncompleteRead.
    b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"accepted\"",
    b"SPAM SPAM SPAM\r\n\r\n",  # not a status line: http.client.BadStatusLine
]


def test_broken_http_responses_are_retried_and_reporting_goes_on(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    sink.raw_responses = list(BROKEN_RESPONSES)
    reporter = make_reporter(sink, counters).start()
    dispatch(counters, 5)
    wait_for(lambda: not sink.raw_responses and reporter.stats().send_failures >= 2)
    dispatch(counters, 9)  # after both broken answers: the thread still cuts and delivers intervals
    wait_for(lambda: reporter.stats().delivered >= 2
             and any(r.interval.peak_runtime_tokens == 9 for r in sink.reports.values()))
    assert reporter._thread.is_alive()
    assert reporter.close("shutdown", timeout_s=10)
    assert_exactly_once(sink, reporter, counters)
    assert sink.duplicates == 2  # both broken answers were to reports the sink had stored


def test_a_broken_response_to_an_inline_final_report_does_not_raise_into_the_dispatch(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters)  # no thread: flush_final sends from the caller's thread
    for raw in BROKEN_RESPONSES:
        sink.raw_responses = [raw]
        dispatch(counters, 3)
        assert reporter.flush_final("overflow", timeout_s=5) is False  # a failed attempt, not an exception
    assert reporter.stats().send_failures == 2 and reporter.stats().pending == 2
    assert reporter.flush_final("shutdown", timeout_s=5)
    assert_exactly_once(sink, reporter, counters, final_reasons=("overflow", "overflow", "shutdown"))
    assert sink.duplicates == 2


def test_an_unexpected_error_in_the_sender_never_ends_reporting_or_reaches_the_dispatch(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    http_sender = HttpReportSender(ReporterOptions(sink.url))
    failures_left = [3]

    def flaky_sender(report):
        if failures_left[0]:
            failures_left[0] -= 1
            raise RuntimeError("a bug in the sender")
        return http_sender(report)

    reporter = make_reporter(sink, counters, sender=flaky_sender).start()
    dispatch(counters, 4)
    wait_for(lambda: reporter.stats().delivered >= 1)
    assert reporter._thread.is_alive() and reporter.stats().send_failures >= 2
    reporter.close()
    failures_left[0] = 1
    dispatch(counters, 6)
    assert reporter.flush_final("overflow", timeout_s=5) is False  # the error stays in the reporter
    assert reporter.flush_final("shutdown", timeout_s=5) is True
    assert_exactly_once(sink, reporter, counters, final_reasons=("overflow", "shutdown"))


def test_a_failure_is_counted_every_time_and_logged_once_per_change_of_state(sink, caplog):
    """Issue #20, finding 5: a token the HTTP library refused logged a traceback on every send. Each failed send
    is counted; the log says when the reporter enters a failing state and when it leaves it, never per send."""
    counters = DispatchCounters(CAP, EP_SIZE)
    http_sender = HttpReportSender(ReporterOptions(sink.url))
    script = ["error"] * 5 + ["busy"] * 5 + ["ok"] + ["error"] * 3  # then "ok" for ever

    def sender(report):
        kind = script.pop(0) if script else "ok"
        if kind == "error":
            raise ValueError("Invalid header value b'Bearer a\\r\\nb'")  # what http.client raised
        if kind == "busy":
            return SendResult(Delivery.RETRY, "HTTP 503 busy")
        return http_sender(report)

    with caplog.at_level(logging.INFO, logger="capwatch.telemetry.reporter"):
        reporter = make_reporter(sink, counters, sender=sender).start()
        dispatch(counters, 4)
        wait_for(lambda: not script and reporter.stats().delivered >= 2)
        assert reporter.close("shutdown", timeout_s=10)
    assert reporter.stats().send_failures == 13
    assert caplog.text.count("capwatch reporter error") == 2  # two streaks of errors: a traceback each
    assert caplog.text.count("Traceback") == 2
    assert caplog.text.count("did not take a report (HTTP 503") == 1
    assert caplog.text.count("accepts reports again") == 2


def test_a_hanging_service_never_holds_the_dispatch_and_flush_final_waits_only_its_timeout(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    sink.hang.set()
    reporter = make_reporter(sink, counters, request_timeout_s=30.0).start()
    wait_for(lambda: reporter.stats().pending >= 1 and reporter.next_sequence == 1)  # a POST is stuck
    for _ in range(500):  # the dispatch never touches the reporter: all of these complete
        dispatch(counters, 7)
    assert counters.snapshot().forward_steps == 500
    started = time.monotonic()
    assert reporter.flush_final("dying", timeout_s=0.3) is False
    assert time.monotonic() - started < 5
    sink.release.set()  # the service answers again: everything, final included, arrives once
    assert reporter.close("shutdown", timeout_s=10)  # waits for "dying": nothing happened since, no second final
    assert_exactly_once(sink, reporter, counters, final_reasons=("dying",))


def test_a_final_report_is_never_merged_away_while_the_buffer_is_full(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    sink.stop()  # refused: the reporter keeps cutting intervals and retrying
    reporter = make_reporter(sink, counters, interval_s=0.02, max_pending_reports=3).start()
    wait_for(lambda: reporter.stats().send_failures >= 1)
    dispatch(counters, 11)
    assert reporter.flush_final("dying", timeout_s=0.05) is False
    for step in range(30):  # ~15 more intervals pile up behind it and get merged
        dispatch(counters, 1 + step)
        time.sleep(0.01)
    assert reporter.stats().pending <= 3
    sink.start()
    assert reporter.close("shutdown", timeout_s=10)
    reports = assert_exactly_once(sink, reporter, counters, final_reasons=("dying", "shutdown"))
    assert len(reports) <= 4


def test_flush_final_without_the_thread_sends_inline_and_a_surviving_rank_reports_on(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters)
    dispatch(counters, 9)
    assert reporter.flush_final("overflow", timeout_s=5)
    dispatch(counters, 4)  # the error was caught; the rank goes on
    assert reporter.flush_final("shutdown", timeout_s=5)
    (reports,) = sink.by_boot().values()
    assert [(r.sequence, r.final_reason, r.interval.forward_steps) for r in reports] == [
        (0, "overflow", 1), (1, "shutdown", 1)]
    assert reports[1].counters.forward_steps == 2


def test_a_rank_that_dies_of_its_overflow_sends_one_final_report_not_a_second_on_exit(sink):
    """The overflow's final report is the rank's last word: close("shutdown") at exit (atexit, the
    plugin's session) sends no second final over it while nothing happened since."""
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters).start()
    dispatch(counters, 7)
    assert reporter.flush_final("overflow: needs 40 tokens", timeout_s=5)
    time.sleep(0.3)  # ticks every 50 ms meanwhile, as a dying rank's reporter keeps its schedule
    assert reporter.close("shutdown", timeout_s=5) is True  # the overflow's final, delivered
    (reports,) = sink.by_boot().values()
    finals = [report.final_reason for report in reports if report.final]
    assert finals == ["overflow: needs 40 tokens"]
    assert reports[-1].final, "a report after the final one: the service takes the dying rank for a live one"


def test_after_a_final_report_an_interval_with_nothing_new_is_not_sent(sink):
    """A tick between the overflow's final report and the rank's death would supersede the final one at the
    service (seen in CI: the rank then read 'stale', not final). Cut by hand here, so nothing depends on timing."""
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters, interval_s=None).start()
    dispatch(counters, 7)
    reporter.cut_interval()
    assert reporter.flush_final("overflow", timeout_s=5)
    after_final = reporter.next_sequence
    for _ in range(3):
        reporter.cut_interval()
    wait_for(lambda: reporter.stats().pending == 0)
    assert reporter.next_sequence == after_final and sink.by_boot()[reporter.identity.boot_id][-1].final
    dispatch(counters, 5)  # the rank survived after all: what it does next is reported, superseding the final
    reporter.cut_interval()
    wait_for(lambda: reporter.next_sequence == after_final + 1 and reporter.stats().pending == 0)
    (reports,) = sink.by_boot().values()
    assert [(r.final, r.interval.forward_steps) for r in reports] == [(False, 1), (True, 0), (False, 1)]


def test_after_a_final_report_a_rank_that_survives_keeps_reporting(sink):
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters).start()
    dispatch(counters, 40)
    assert reporter.flush_final("overflow", timeout_s=5)
    after_final = reporter.next_sequence
    dispatch(counters, 6)
    wait_for(lambda: any(r.sequence >= after_final and r.interval.forward_steps for r in sink.reports.values()))
    assert reporter.close("shutdown", timeout_s=10)
    reports = assert_exactly_once(sink, reporter, counters, final_reasons=("overflow", "shutdown"))
    assert reports[-1].counters.forward_steps == 2


def exported_reporter_counters(reporter: RankReporter, counters: DispatchCounters) -> dict[str, float]:
    collector = DispatchCollector(reporter.tracker, reporter.identity, reporter.config, reporter_stats=reporter.stats)
    text = RankExporter(collector).render().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("moe_a2a_report")}


def test_bearer_token_is_sent_and_a_wrong_one_is_retried_logged_with_its_status_and_counted_apart(caplog):
    sink = ReportSink(bearer_token="s3cret").start()
    try:
        counters = DispatchCounters(CAP, EP_SIZE)
        with caplog.at_level(logging.ERROR, logger="capwatch.telemetry.reporter"):
            wrong = make_reporter(sink, counters, bearer_token="nope").start()
            wait_for(lambda: wrong.stats().auth_failures >= 2)  # counted once the 401 is read, after the sink's
        stats = wrong.stats()
        assert sink.unauthorized >= 2 and stats.send_failures == 0 and stats.rejected == 0
        assert stats.pending >= 1 and not sink.reports
        assert "HTTP 401" in caplog.text and "bearer token" in caplog.text and "unreachable" not in caplog.text
        assert caplog.text.count("HTTP 401") == 1  # once per streak, not per retry
        exported = exported_reporter_counters(wrong, counters)
        assert exported["moe_a2a_report_auth_failures_total"] >= 2
        assert exported["moe_a2a_reports_rejected_total"] == exported["moe_a2a_report_send_failures_total"] == 0
        wrong.close()
        right = make_reporter(sink, counters, bearer_token="s3cret")
        dispatch(counters, 4)
        assert right.flush_final("done", timeout_s=5)
        assert len(sink.reports) == 1
    finally:
        sink.stop()


def test_a_report_refused_for_good_is_dropped_logged_with_its_status_and_counted_as_rejected(sink, caplog):
    counters = DispatchCounters(CAP, EP_SIZE)
    reporter = make_reporter(sink, counters, service_url=sink.url + "/not-capwatch")  # the sink answers 404
    dispatch(counters, 4)
    with caplog.at_level(logging.ERROR, logger="capwatch.telemetry.reporter"):
        assert reporter.flush_final("done", timeout_s=5) is False
    stats = reporter.stats()
    assert (stats.rejected, stats.pending, stats.send_failures, stats.auth_failures) == (1, 0, 0, 0)
    assert "HTTP 404" in caplog.text and "refused report" in caplog.text
    exported = exported_reporter_counters(reporter, counters)
    assert exported["moe_a2a_reports_rejected_total"] == 1
    assert exported["moe_a2a_report_auth_failures_total"] == 0


@pytest.mark.parametrize("status, verdict", [
    (200, Delivery.DELIVERED), (202, Delivery.DELIVERED), (500, Delivery.RETRY), (503, Delivery.RETRY),
    (429, Delivery.RETRY), (401, Delivery.UNAUTHORIZED), (403, Delivery.UNAUTHORIZED), (400, Delivery.REJECTED), (413, Delivery.REJECTED),
    (422, Delivery.REJECTED),
])
def test_status_classification(status, verdict):
    assert classify_status(status) is verdict


@pytest.mark.parametrize("options, message", [
    (dict(service_url="127.0.0.1:8000"), "not an http\\(s\\) URL with a host, like http://127.0.0.1:8321"),
    (dict(service_url="ftp://x"), "not an http\\(s\\) URL"),
    (dict(service_url="http://x:abc"), "port 'abc' is not a number in 1..65535"),
    (dict(service_url="http://x:8321/\r\nHost: evil"), "the character '\\\\r'"),
    (dict(service_url="http://x\x00:8321"), "the character '\\\\x00'"),
    (dict(service_url="http://user:pw@x:8321"), "user:password@"),
    (dict(service_url="http://x", bearer_token="a\r\nb"), "Authorization header: it contains the character"),
    (dict(service_url="http://x", bearer_token="caf\u00e9\u2603"), "non-ASCII"),
    (dict(service_url="http://x", interval_s=0), "interval_s must be within 0.01..86400 s"),
    (dict(service_url="http://x", interval_s=1e10), "interval_s must be within"),  # Event.wait overflowed: 100 % CPU
    (dict(service_url="http://x", interval_s=1e-300), "interval_s must be within"),  # 1,100 reports a second
    (dict(service_url="http://x", interval_s=float("nan")), "interval_s must be within"),
    (dict(service_url="http://x", request_timeout_s=1e9), "request_timeout_s must be within"),
    (dict(service_url="http://x", max_pending_reports=2), "max_pending_reports must be >= 3"),
    (dict(service_url="http://x", backoff_initial_s=5, backoff_max_s=1), "backoff_max_s"),
])
def test_bad_options_are_refused_with_what_to_fix(options, message):
    with pytest.raises(ValueError, match=message):
        ReporterOptions(**options)


def test_counters_that_do_not_match_the_config_are_refused(sink):
    with pytest.raises(ValueError, match="do not match"):
        make_reporter(sink, DispatchCounters(CAP * 2, EP_SIZE))


def test_a_reporter_cut_by_its_caller_sends_nothing_uncut_and_dates_intervals_by_the_callers_clock(sink):
    """interval_s=None: no interval is cut but by cut_interval() (and the final one); each is dated by the
    tracker's clock, here a replay's, which runs on whatever the caller says, not the wall's."""
    from capwatch.telemetry.intervals import IntervalTracker

    replay = [1_700_000_000.0]
    counters = DispatchCounters(CAP, EP_SIZE)
    identity = RankIdentity(cluster="unit", ep_rank=1, ep_size=EP_SIZE, boot_id=new_boot_id())
    config = rank_config(cap=CAP, ep_size=EP_SIZE, hidden_size=8, top_k=2, num_experts=4, backend="torch")
    reporter = RankReporter(counters, identity, config,
                            ReporterOptions(service_url=sink.url, interval_s=None, request_timeout_s=15.0),
                            tracker=IntervalTracker(counters, clock=lambda: replay[0])).start()
    for runtime_tokens in (3, 9, 4):
        dispatch(counters, runtime_tokens)
    time.sleep(0.3)  # the thread runs, but only the caller cuts
    assert sink.by_boot() == {}
    replay[0] += 0.5
    reporter.cut_interval()
    wait_for(lambda: reporter.stats().delivered == 1)
    dispatch(counters, 7)
    replay[0] += 0.75
    assert reporter.close("shutdown", timeout_s=10)
    first, final = assert_exactly_once(sink, reporter, counters)
    assert (first.interval.start_unix_s, first.interval.end_unix_s) == (1_700_000_000.0, 1_700_000_000.5)
    assert (first.interval.forward_steps, first.interval.peak_runtime_tokens) == (3, 9)
    assert (final.interval.start_unix_s, final.interval.end_unix_s) == (1_700_000_000.5, 1_700_000_001.25)
    assert (final.interval.forward_steps, final.interval.peak_runtime_tokens) == (1, 7)
