"""Issue #36, F16: 4 clients posting 3.7 MB reports whose 350,000-bin histogram fails validation at its end pushed
a rank's post to p50 425 ms (max 1,449 ms) and ``/healthz`` to 1,469 ms: each was validated on the event loop,
most of it in pydantic's compiled code, which holds the GIL (a thread would not have let the loop run either).
Bodies over ``HEAVY_BODY_BYTES`` are now validated in a worker process (``report_rules.HeavyBodies``). Against a
real ``capwatch serve`` on loopback, the control measured in the same run: one heavy body's refusal alone; while
4 clients post such bodies, the typical ``/healthz`` and rank post take a fraction of it, and the heavy bodies
get the same 422 as before."""

from __future__ import annotations

import json
import statistics
import threading
import time

import pytest

from tests.support.raw_http import exchange, request, status_of
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank

HEAVY_CLIENTS = 4
BINS = 280_000  # ~3.7 MB: under CAPWATCH_MAX_BODY_BYTES (4 MiB)
FLOOD_S = 15.0


def heavy_invalid_body() -> bytes:
    """A ~4 MB report whose histogram holds one step more than the interval's forward_steps: found at its end."""
    now = time.time()
    body = SimulatedRank("heavy", 0, 8, cap=1 << 20).report(now - 10, now - 5, [100])
    body["interval"]["runtime_tokens_histogram"] = [[tokens, 1] for tokens in range(BINS)]
    body["interval"]["forward_steps"] = BINS - 1
    return json.dumps(body).encode()


def _post(port: int, body: bytes, timeout_s: float = 30.0) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    answer = exchange(port, request("/v1/reports", "POST", headers=(("Content-Type", "application/json"),),
                                    body=body, close=True), timeout_s)
    return status_of(answer), answer, time.perf_counter() - started


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(tmp_path_factory.mktemp("heavy") / "capwatch.db") as process:
        yield process


def test_heavy_invalid_bodies_do_not_hold_up_the_others(service):
    heavy = heavy_invalid_body()
    status, answer, _ = _post(service.port, heavy)  # the first starts the worker process
    assert status == 422 and b"runtime_tokens_histogram holds" in answer, answer[-400:]
    control = statistics.median(_post(service.port, heavy)[2] for _ in range(3))
    stop = threading.Event()
    refused: list[int] = []

    def flood() -> None:
        while not stop.is_set():
            refused.append(_post(service.port, heavy)[0])

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(HEAVY_CLIENTS)]
    for thread in threads:
        thread.start()
    rank = SimulatedRank("honest", 0, 1, cap=1024)
    healthz, posts = [], []
    try:
        time.sleep(1.0)
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:
            started = time.perf_counter()
            assert status_of(exchange(service.port, request("/healthz", close=True), 30)) == 200
            healthz.append(time.perf_counter() - started)
            begin = time.time() - 5
            status, answer, seconds = _post(service.port, json.dumps(rank.report(begin, begin + 5, [100])).encode())
            assert status == 202, answer
            posts.append(seconds)
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    print(f"\none heavy invalid body alone: {control * 1000:.0f} ms; with {HEAVY_CLIENTS} clients posting them "
          f"({len(refused)} refused): /healthz p50 {statistics.median(healthz) * 1000:.0f} ms max "
          f"{max(healthz) * 1000:.0f} ms, a rank's post p50 {statistics.median(posts) * 1000:.0f} ms max "
          f"{max(posts) * 1000:.0f} ms")
    assert refused and set(refused) <= {422, 503}, set(refused)
    assert 422 in refused
    # Validated on the loop, each waited behind the bodies in validation: a typical one about as long as the
    # control. Off the loop, a fraction of it.
    assert statistics.median(healthz) < control / 4
    assert statistics.median(posts) < control / 4
