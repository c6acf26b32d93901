"""Issue #20, finding 1: 100 clients asking for `GET /v1/clusters/{c}/history?since_s=1&limit=100000` and never
reading took the service from 65 MB to 5.2 GB of RSS in 60 s, and /healthz timed out. The history is streamed a
page of rows at a time (service/api/history_stream.py), so a request holds a page, and a client that does not read
is dropped (service/http_server.py). Against a real `capwatch serve` on loopback, bounded: 20,000 intervals, 100
clients, a 2 s send deadline."""

from __future__ import annotations

import time

import httpx
import pytest
from capwatch.advisor.sample import RankInterval, group_samples
from capwatch.service.api.history_stream import history_json
from capwatch.service.api.routes.clusters import ClusterHistory
from capwatch.service.sources.contract import IntervalRow, pages_of
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport
from hypothesis import given
from hypothesis import strategies as st

from tests.support.raw_http import request, unread_flood
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank

RANKS = 8
INTERVALS_PER_RANK = 2500
CLIENTS = 100
# The service's growth allowed while 100 clients hold unread history answers of ~3.5 MB each: a page of rows and
# a connection's output buffer each. Built whole, those answers were 5 GB.
RSS_GROWTH_CEILING = 160 << 20


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("history")
    now = time.time()
    start = now - INTERVALS_PER_RANK * 5 - 60
    store = Store(folder / "capwatch.db", StoreOptions(maintenance_interval_s=3600.0))
    try:
        ranks = [SimulatedRank("deep", rank, RANKS, cap=1024) for rank in range(RANKS)]
        futures = []
        for step in range(INTERVALS_PER_RANK):
            begin = start + 5 * step
            for rank in ranks:
                body = rank.report(begin, begin + 5, [100 + (step * 7 + rank.ep_rank) % 500])
                futures.append(store.submit(RankReport.model_validate(body, strict=False), now))
        for future in futures:
            future.result()
    finally:
        store.close()
    with ServiceProcess(folder / "capwatch.db", env={"CAPWATCH_SEND_TIMEOUT_S": "2"}) as process:
        yield process


def test_the_streamed_history_is_the_whole_answer(service):
    with httpx.Client(base_url=service.url, timeout=60) as client:
        response = client.get("/v1/clusters/deep/history", params={"since_s": 1, "limit": 100_000})
        assert response.status_code == 200 and response.headers.get("content-length") is None  # streamed
        history = ClusterHistory.model_validate_json(response.content)
        assert not history.truncated
        assert [series.ep_rank for series in history.ranks] == list(range(RANKS))
        assert all(len(series.points) == INTERVALS_PER_RANK for series in history.ranks)
        for series in history.ranks:  # each rank's series in time order
            ends = [point.interval_end_unix_s for point in series.points]
            assert ends == sorted(ends)
        assert len(history.group) > 0 and all(point.ranks == RANKS for point in history.group[1:-1])
        cut = ClusterHistory.model_validate_json(client.get(
            "/v1/clusters/deep/history", params={"since_s": 1, "limit": 1000}).content)
        assert cut.truncated and sum(len(series.points) for series in cut.ranks) == 1000
        newest = max(point.interval_end_unix_s for series in history.ranks for point in series.points)
        assert max(point.interval_end_unix_s for series in cut.ranks for point in series.points) == newest


def test_clients_that_do_not_read_the_history_hold_no_copy_of_it(service):
    flood = unread_flood(service.port, service.process.pid, request("/v1/clusters/deep/history?since_s=1&limit=100000"),
                         CLIENTS, 120)
    print("\n" + flood.line(f"{CLIENTS} unread histories of {RANKS * INTERVALS_PER_RANK} intervals"))
    assert flood.rss_growth < RSS_GROWTH_CEILING, f"RSS grew by {flood.rss_growth / 2**20:.0f} MiB"
    assert flood.slowest_healthz_ms < 5000


def built_whole(rows: list[IntervalRow], limit: int, window_s: float) -> dict:
    """The answer as the route built it before it streamed: every row at once (the reference)."""
    by_rank: dict[int, list[dict]] = {}
    for row in sorted(rows, key=lambda row: (row.interval_end_unix_s, row.ep_rank)):
        by_rank.setdefault(row.ep_rank, []).append(dict(
            interval_end_unix_s=row.interval_end_unix_s, peak_runtime_tokens=row.peak_runtime_tokens, cap=row.cap,
            utilization=row.peak_runtime_tokens / row.cap, forward_steps=row.forward_steps,
            overflow_events=row.overflow_events, max_local_tokens=row.max_local_tokens))
    samples = group_samples((RankInterval(row.ep_rank, row.interval_end_unix_s, row.peak_runtime_tokens, row.cap,
                                          row.overflow_events, row.forward_steps)
                             for row in sorted(rows, key=lambda row: (row.interval_end_unix_s, row.ep_rank))),
                            window_s)
    return {"truncated": len(rows) >= limit,
            "ranks": [{"ep_rank": rank, "points": points} for rank, points in sorted(by_rank.items())],
            "group": [{"window_start_unix_s": sample.window_start_s, "peak_runtime_tokens": sample.peak_runtime_tokens,
                       "cap": sample.cap, "utilization": sample.peak_runtime_tokens / sample.cap,
                       "overflow_events": sample.overflow_events, "ranks": len(sample.ranks)} for sample in samples]}


class PagedRows:
    """A source that hands its rows in pages of ``page_rows`` (the contract's ``pages_of``), whatever is asked."""

    def __init__(self, rows: list[IntervalRow], page_rows: int):
        self.rows, self.page_rows = rows, page_rows

    def interval_pages(self, cluster, role, since_unix_s, until_unix_s, limit, orders, page_rows):
        return pages_of(self.rows, limit, orders, self.page_rows)


ROWS = st.lists(st.builds(
    IntervalRow, ep_rank=st.integers(0, 5), interval_end_unix_s=st.integers(0, 40).map(lambda step: 1000.0 + 7.5 * step),
    peak_runtime_tokens=st.integers(0, 5000), cap=st.sampled_from([128, 1024, 4096]),
    forward_steps=st.integers(0, 3), overflow_events=st.integers(0, 2),
    max_local_tokens=st.one_of(st.none(), st.integers(0, 5000))), max_size=60).map(
    lambda rows: list({(row.ep_rank, row.interval_end_unix_s): row for row in rows}.values()))


@given(rows=ROWS, page_rows=st.integers(1, 9), window_s=st.sampled_from([7.5, 15.0, 60.0]))
def test_the_streamed_answer_is_the_one_built_whole(rows, page_rows, window_s):
    """Whatever the rows and wherever the pages cut them (a window's rows split across pages, a rank's series
    too), the streamed JSON is the answer built from every row at once."""
    import json

    streamed = json.loads(b"".join(history_json(PagedRows(rows, page_rows), "c", "target", 1.0, 2.0, 100, window_s)))
    assert {key: streamed[key] for key in ("cluster", "role", "since_unix_s", "until_unix_s", "window_s")} == {
        "cluster": "c", "role": "target", "since_unix_s": 1.0, "until_unix_s": 2.0, "window_s": window_s}
    assert {key: streamed[key] for key in ("truncated", "ranks", "group")} == built_whole(rows, 100, window_s)
    ClusterHistory.model_validate(streamed)


def test_every_history_page_is_read_from_a_covering_index(tmp_path):
    """Issue #36 (F20): each page's rows were looked up in the table, past their large payload (to reach
    max_local_tokens); both orders of the history now read an index alone (benchmarks/history_read.py)."""
    from capwatch.service.store import reads

    store = Store(tmp_path / "c.db")
    try:
        statements: list[str] = []
        connection = store._reader()
        connection.set_trace_callback(statements.append)
        truncated, pages = reads.interval_pages(store._reader, "none", "target", 0.0, 1e10, 100, ("rank", "time"), 10)
        for order in pages:
            list(order)
        connection.set_trace_callback(None)
        page_queries = [text for text in statements if "ORDER BY" in text and "LIMIT" in text and "OFFSET" not in text]
        assert len(page_queries) == 2
        for text in page_queries:
            plan = " ".join(row[3] for row in connection.execute("EXPLAIN QUERY PLAN " + text))
            assert "COVERING INDEX" in plan, (text, plan)
    finally:
        store.close()
