"""Issue #36, F2b: 1,000 clients of the list and ``/metrics`` that do not read, at 5,000 clusters, took the service
from 541 to 977 MB, and a rank's post took 9.2 s: each request built its own list of the answer's parts (45,000
references for ``/metrics``) and held it while its client did not read. Both answers are now one bytes shared by
every client until the list changes (``service/api/streaming.py``), handed out as views. Against a real
``capwatch serve`` on loopback at 5,000 clusters: 600 such clients cost the service at most its output buffer and
a piece each, and a rank's report is answered while they are held."""

from __future__ import annotations

import json
import time

import pytest
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport

from tests.support.raw_http import closed_by_peer, connect, exchange, request, rss_bytes, status_of
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank
from tests.support.waiting import wait_for

CLUSTERS = 5000
CLIENTS = 600  # half ask for the list, half for /metrics
SEND_TIMEOUT_S = 5.0
# Each client may cost the service its output buffer (64 KiB), one piece (16 KiB) and its connection's state.
# e0cc95d's per-request lists of parts: a /metrics client held ~0.4 MB more.
RSS_GROWTH_CEILING = 96 << 20


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("many_clusters")
    now = time.time()
    store = Store(folder / "capwatch.db", StoreOptions(maintenance_interval_s=3600.0))
    try:
        futures = [store.submit(RankReport.model_validate(
            SimulatedRank(f"c{index:05d}", 0, 1, cap=1024).report(now - 30, now - 20, [100, 200]), strict=False), now)
            for index in range(CLUSTERS)]
        for future in futures:
            future.result()
    finally:
        store.close()
    with ServiceProcess(folder / "capwatch.db", env={"CAPWATCH_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S)}) as process:
        yield process


def test_clients_of_the_list_and_metrics_that_do_not_read_share_one_answer(service):
    assert status_of(exchange(service.port, request("/v1/clusters", close=True), 60)) == 200  # the digests, ready
    assert status_of(exchange(service.port, request("/metrics", close=True), 60)) == 200
    before = rss_bytes(service.process.pid)
    sockets = []
    try:
        for index in range(CLIENTS):
            sock = connect(service.port, receive_buffer=4096)
            sock.sendall(request("/v1/clusters" if index % 2 else "/metrics"))
            sockets.append(sock)
        time.sleep(1.0)
        held = rss_bytes(service.process.pid)
        rank = SimulatedRank("honest", 0, 1, cap=1024)
        begin = time.time() - 5
        started = time.perf_counter()
        answer = exchange(service.port, request("/v1/reports", "POST", headers=(("Content-Type", "application/json"),),
                                                body=json.dumps(rank.report(begin, begin + 5, [100])).encode(),
                                                close=True), 10)
        post_s = time.perf_counter() - started
        peak = max(held, rss_bytes(service.process.pid))
        wait_for(lambda: all(closed_by_peer(sock) for sock in sockets), 60 + 3 * SEND_TIMEOUT_S,
                 "the service to drop every client that does not read", poll_s=0.5)
    finally:
        for sock in sockets:
            sock.close()
    print(f"\n{CLIENTS} non-reading clients of the list and /metrics at {CLUSTERS} clusters: RSS "
          f"{before / 2**20:.0f} -> {peak / 2**20:.0f} MiB; a rank's post {post_s * 1000:.0f} ms")
    assert status_of(answer) == 202, answer
    assert peak - before < RSS_GROWTH_CEILING, f"RSS grew by {(peak - before) / 2**20:.0f} MiB"
