"""Durability with the real server: SIGKILL under concurrent load loses no acknowledged report,
and the restarted service gives the advice the committed reports imply."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.service.conftest import JSON
from capwatch.service.config import Settings
from tests.support.service import ServiceProcess
from capwatch.service.main import store_options
from tests.support.simulate import SimulatedRank
from capwatch.service.store.sqlite import Store
from capwatch.service.queries import cluster_advice
from capwatch.telemetry.report import RankReport

EP_SIZE = 16
REPORTS_PER_RANK = 100
THREADS = 8


def key_of(report: dict) -> tuple:
    identity = report["identity"]
    return identity["cluster"], identity["role"], identity["ep_rank"], identity["boot_id"], report["sequence"]


def make_reports() -> dict[tuple, dict]:
    start = time.time() - 3 * 3600  # recent: inside the fold window, so nothing is folded meanwhile
    reports = {}
    for rank in range(EP_SIZE):
        simulated = SimulatedRank("durable", rank, EP_SIZE, cap=2048)
        for sequence in range(REPORTS_PER_RANK):
            begin = start + sequence * 60.0
            peak = 300 + (rank * 37 + sequence * 11) % 400 + (900 if (rank, sequence) == (5, 80) else 0)
            report = simulated.report(begin, begin + 59.0, [peak // 3, peak])
            reports[key_of(report)] = report
    return reports


def advice_of(url: str) -> dict:
    advice = httpx.get(f"{url}/v1/clusters/durable/advice", timeout=30).json()
    for key in ("generated_unix_s", "cluster", "role"):
        advice.pop(key)
    return advice


def reference_advice(tmp_path, reports: list[dict]) -> dict:
    """The same reports through an in-process store: what the service must answer."""
    tmp_path.mkdir()
    settings = Settings(db_path=tmp_path / "reference.db")
    store = Store(settings.db_path, store_options(settings))
    try:
        for report in reports:
            store.submit(RankReport.model_validate_json(json.dumps(report)))
        store.run_in_writer(lambda _: None).result()
        return cluster_advice(store, "durable", "target", time.time(), settings).model_dump()
    finally:
        store.close()


def stored_keys(db_path) -> set[tuple]:
    import sqlite3

    with sqlite3.connect(db_path) as connection:
        return set(connection.execute("SELECT cluster, role, ep_rank, boot_id, sequence FROM reports"))


@pytest.fixture
def service(tmp_path):
    processes: list[ServiceProcess] = []

    def start() -> ServiceProcess:
        process = ServiceProcess(tmp_path / "capwatch.db", port=processes[0].port if processes else None)
        processes.append(process)
        return process.start()

    yield start
    for process in processes:
        process.kill()


def test_sigkill_under_load_keeps_every_acknowledged_report_and_the_advice(tmp_path, service):
    reports = make_reports()
    by_thread = [[] for _ in range(THREADS)]
    for key in sorted(reports, key=lambda k: (k[4], k[2])):  # interleave ranks in time
        by_thread[key[2] % THREADS].append(key)
    acknowledged: set[tuple] = set()
    lock = threading.Lock()
    server = service()
    url = server.url  # the restarted server listens on the same port

    def send(keys: list[tuple]) -> None:
        with httpx.Client(base_url=url, timeout=10, headers=JSON) as client:
            for key in keys:
                try:
                    response = client.post("/v1/reports", content=json.dumps(reports[key]))
                except httpx.TransportError:
                    return  # the server is gone
                assert response.status_code in (200, 202), response.text
                with lock:
                    acknowledged.add(key)

    threads = [threading.Thread(target=send, args=(keys,)) for keys in by_thread]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(acknowledged) < len(reports) // 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.kill()  # mid-load: requests are in flight and batches are being committed
    for thread in threads:
        thread.join(timeout=30)
    assert 0 < len(acknowledged) < len(reports), "the kill must land mid-load"

    stored = stored_keys(tmp_path / "capwatch.db")
    assert acknowledged <= stored, f"{len(acknowledged - stored)} acknowledged reports were lost"
    server = service()
    assert advice_of(server.url) == reference_advice(tmp_path / "a", [reports[key] for key in sorted(stored)])

    # The ranks retry what was not acknowledged (duplicates are acknowledged and ignored) ...
    retries = sorted(set(reports) - acknowledged)
    threads = [threading.Thread(target=send, args=(retries[index::THREADS],)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert acknowledged == set(reports)
    complete = advice_of(server.url)
    assert complete["sample_count"] == REPORTS_PER_RANK
    assert complete["max_peak_runtime_tokens"] == 1465  # rank 5's burst sets the group's sample
    server.kill()  # ... and a kill while idle changes nothing either
    server = service()
    assert stored_keys(tmp_path / "capwatch.db") == set(reports)
    assert advice_of(server.url) == complete == reference_advice(tmp_path / "b", list(reports.values()))
    assert complete["action"] == "hold"  # 100 min of history: 2048 lies within the (wide) bounds
