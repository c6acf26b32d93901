"""Issue #20, finding 6: clusters were unbounded (about 24 KB each, no limit). The store holds at most
``max_clusters`` clusters and ``max_ranks`` ranks: a report that would add one more is refused (429 with
Retry-After, which a rank's reporter retries, keeping the report buffered), every report of what is held is taken,
and room comes back when a silent cluster is pruned. The writer checks it, so the bound is exact."""

from __future__ import annotations

import json

import httpx
import pytest
from capwatch.service.store.errors import StoreFull
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport

from tests.service.conftest import JSON, T0, FakeClock
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank


def report(cluster: str, rank: int = 0, ep_size: int = 4, start: float = T0) -> RankReport:
    body = SimulatedRank(cluster, rank, ep_size, cap=1024).report(start, start + 10, [100])
    return RankReport.model_validate(body, strict=False)


def test_past_its_bounds_the_store_refuses_new_clusters_and_ranks_and_takes_the_rest(tmp_path):
    clock = FakeClock(T0 + 20)
    store = Store(tmp_path / "c.db", StoreOptions(max_clusters=3, max_ranks=5, maintenance_interval_s=3600.0), clock)
    try:
        futures = [store.submit(report(name), T0 + 20) for name in ("a", "b", "c", "d")]
        assert [future.exception() is None for future in futures] == [True, True, True, False]
        assert isinstance(futures[3].exception(), StoreFull) and "CAPWATCH_MAX_CLUSTERS" in str(futures[3].exception())
        assert store.held() == (3, 3)
        assert store.submit(report("a", rank=1), T0 + 20).result().accepted  # a new rank of a held cluster: room
        assert store.submit(report("b", rank=1), T0 + 20).result().accepted
        full = store.submit(report("c", rank=1), T0 + 20)  # the sixth rank
        assert isinstance(full.exception(), StoreFull) and "CAPWATCH_MAX_RANKS" in str(full.exception())
        assert store.submit(report("a", start=T0 + 11), T0 + 21).result().accepted  # what is held: always taken
        assert store.held() == (3, 5) and store.clusters() == ["a", "b", "c"]
        clock.now = T0 + store.options.retention_s + 100  # every rank silent past the retention: pruned
        store.maintain()
        assert store.held() == (0, 0)
        assert store.submit(report("d", start=clock.now - 20), clock.now).result().accepted  # room again
    finally:
        store.close()


def test_in_one_batch_the_bound_is_exact(tmp_path):
    import asyncio

    store = Store(tmp_path / "c.db", StoreOptions(max_clusters=4, maintenance_interval_s=3600.0), FakeClock(T0 + 20))

    async def together():  # one event-loop turn: one batch for the writer
        return await asyncio.gather(*(store.submit_async(report(f"n{index}"), T0 + 20) for index in range(10)),
                                    return_exceptions=True)

    try:
        results = asyncio.run(together())
        assert [isinstance(result, StoreFull) for result in results] == [False] * 4 + [True] * 6
        assert store.held() == (4, 4)
    finally:
        store.close()


@pytest.fixture
def small_service(tmp_path):
    env = {"CAPWATCH_MAX_CLUSTERS": "5", "CAPWATCH_MAX_RANKS": "1000"}
    with ServiceProcess(tmp_path / "capwatch.db", env=env) as service:
        yield service


def test_a_real_service_answers_429_past_its_bound_and_says_so_in_its_metrics(small_service):
    import time

    statuses = []
    with httpx.Client(base_url=small_service.url, headers=JSON) as client:
        for index in range(8):
            now = time.time()
            body = json.dumps(SimulatedRank(f"k{index}", 0, 1, cap=1024).report(now - 10, now, [100]))
            response = client.post("/v1/reports", content=body)
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.headers["retry-after"] == "60"
                assert "holds 5 clusters, its bound (CAPWATCH_MAX_CLUSTERS)" in response.json()["detail"]
        metrics = client.get("/metrics").text
    assert statuses == [202] * 5 + [429] * 3
    assert "capwatch_store_clusters 5.0" in metrics and "capwatch_store_clusters_limit 5.0" in metrics
    assert 'capwatch_reports_rejected_total{reason="full"} 3.0' in metrics
    assert "its bound (CAPWATCH_MAX_CLUSTERS)" in small_service.log_path.read_text()  # said in the log, once
    assert small_service.log_path.read_text().count("CAPWATCH_MAX_CLUSTERS") == 1
