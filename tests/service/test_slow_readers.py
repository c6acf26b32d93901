"""Issue #36, F19: 2,000 connections each asking for a large history (16.7 MB) and reading it 4 KiB every 8 s
froze the service: for 60 s every rank post and ``/healthz`` timed out (10 s). Each answer's pieces were made in
the thread pool every route shares, 40 threads at once, and the event loop was left short of the GIL. The pieces
are now made by the history's own two workers, in turn (``service/api/history_stream.py``), a slow reader holds
a page and its output buffer. Scaled down, against a real ``capwatch serve`` on loopback: 400 slow readers of a
~3.4 MB history, and meanwhile ``/healthz`` and a rank's report are answered, and the memory held is bounded."""

from __future__ import annotations

import json
import time

import pytest
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport

from tests.support.raw_http import connect, exchange, request, rss_bytes, status_of
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank

RANKS = 8
INTERVALS_PER_RANK = 2500
READERS = 400
READ_BYTES = 4096
READ_EVERY_S = 2.0
WATCH_S = 25.0
# What a rank and a liveness probe wait for before they give up (the 10 s).
ANSWER_TIMEOUT_S = 10.0
# The service's growth allowed with 400 slow readers: each holds a page of rows, a piece of JSON and its output
# buffer (64 KiB): under 0.2 MiB each (e0cc95d: +245 MiB, new: +74 MiB), far below the answers (400 x 3.4 MB).
RSS_GROWTH_CEILING = 128 << 20


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slow_readers")
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
    # The readers read: they are slow, not silent, so the service keeps them (a send timeout well past the pace).
    with ServiceProcess(folder / "capwatch.db", env={"CAPWATCH_SEND_TIMEOUT_S": "60",
                                                     "CAPWATCH_MAX_CONNECTIONS": "2048"}) as process:
        yield process


def _timed(port: int, data: bytes) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        answer = exchange(port, data, ANSWER_TIMEOUT_S)
    except TimeoutError:
        return 0, ANSWER_TIMEOUT_S
    return status_of(answer), time.perf_counter() - started


def test_slow_readers_of_a_large_history_leave_the_service_answering(service):
    rank = SimulatedRank("other", 0, 1, cap=1024)
    asked = request("/v1/clusters/deep/history?since_s=1&limit=100000")
    before = rss_bytes(service.process.pid)
    peak = before
    readers = []
    polls: list[tuple[str, int, float]] = []
    try:
        for _ in range(READERS):
            sock = connect(service.port, receive_buffer=READ_BYTES)
            sock.sendall(asked)
            sock.setblocking(False)
            readers.append(sock)
        received = dict.fromkeys(readers, 0)
        started = time.monotonic()
        next_read = next_poll = started
        while time.monotonic() - started < WATCH_S:
            now = time.monotonic()
            if now >= next_read:  # each reader takes 4 KiB
                for sock in readers:
                    try:
                        received[sock] += len(sock.recv(READ_BYTES))
                    except BlockingIOError:
                        pass
                next_read = now + READ_EVERY_S
            if now >= next_poll:
                polls.append(("healthz", *_timed(service.port, request("/healthz", close=True))))
                begin = time.time() - 5
                body = json.dumps(rank.report(begin, begin + 5, [100])).encode()
                polls.append(("report", *_timed(service.port, request(
                    "/v1/reports", "POST", headers=(("Content-Type", "application/json"),), body=body, close=True))))
                peak = max(peak, rss_bytes(service.process.pid))
                next_poll = time.monotonic() + 1.0
            time.sleep(0.05)
        reading = sum(1 for count in received.values() if count > 0)
    finally:
        for sock in readers:
            sock.close()
    slowest = {what: max(seconds for name, _, seconds in polls if name == what) for what in ("healthz", "report")}
    print(f"\n{READERS} slow readers: RSS {before / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB; slowest /healthz "
          f"{slowest['healthz']:.2f} s, slowest report {slowest['report']:.2f} s ({len(polls) // 2} of each); "
          f"{reading} readers got data")
    failed = [(name, status, round(seconds, 2)) for name, status, seconds in polls
              if status != (200 if name == "healthz" else 202)]
    assert not failed, f"not answered within {ANSWER_TIMEOUT_S:g} s while {READERS} clients read slowly: {failed}"
    assert reading == READERS  # every reader is served, slowly
    assert peak - before < RSS_GROWTH_CEILING, f"RSS grew by {(peak - before) / 2**20:.0f} MiB"
