"""The store's writer queue is bounded: past ``max_pending_reports`` a submit is refused at once
(503 + Retry-After over HTTP) instead of queueing without limit; and no submit racing ``close``
is left waiting forever."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading

import httpx
import pytest

from capwatch.service.config import Settings
from capwatch.service.main import create_app
from tests.support.simulate import SimulatedRank
from capwatch.service.store.errors import StoreUnavailable
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport
from tests.service.conftest import JSON, T0, FakeClock

BOUND = 3


def _reports(count: int, cluster: str = "bp") -> list[RankReport]:
    rank = SimulatedRank(cluster, 0, 1, cap=512)
    return [RankReport.model_validate(rank.report(T0 + index, T0 + index + 1, [100]), strict=False)
            for index in range(count)]


def _block_writer(store: Store) -> threading.Event:
    """Hold the writer thread until the returned event is set (so reports pile up)."""
    release, holding = threading.Event(), threading.Event()

    def hold(_connection) -> None:
        holding.set()
        release.wait(10)

    store.run_in_writer(hold)
    assert holding.wait(10)
    return release


@pytest.fixture
def bounded_store(tmp_path):
    store = Store(tmp_path / "bounded.db", StoreOptions(max_pending_reports=BOUND), FakeClock())
    yield store
    store.close()


def test_a_burst_past_the_bound_is_refused_at_once_and_the_rest_are_stored(bounded_store):
    release = _block_writer(bounded_store)
    futures = [bounded_store.submit(report, T0) for report in _reports(BOUND + 4)]
    refused = [future for future in futures if future.done()]
    assert len(refused) == 4 and all(isinstance(future.exception(), StoreUnavailable) for future in refused)
    assert "max_pending_reports" in str(refused[0].exception())
    assert bounded_store.pending_reports == BOUND
    release.set()
    accepted = [future.result(timeout=10) for future in futures[:BOUND]]
    assert all(result.accepted and not result.duplicate for result in accepted)
    assert bounded_store.pending_reports == 0 and bounded_store.report_count() == BOUND
    # room again once committed
    assert bounded_store.submit(_reports(1, "bp2")[0], T0).result(timeout=10).accepted


def test_over_http_a_burst_gets_503_with_retry_after_and_never_more_than_the_bound_pending(tmp_path):
    # Every in-process request's body takes a slot (the ASGI transport hands it over a turn later): one client may
    # hold them all here, so the store's bound, not the gate's share, is what the burst meets.
    settings = Settings(db_path=tmp_path / "http.db", maintenance_interval_s=3600.0, max_bodies_per_client=64)
    clock = FakeClock(T0 + 10)
    store = Store(settings.db_path, StoreOptions(max_pending_reports=BOUND), clock)
    app = create_app(settings, store=store, clock=clock)
    ranks = [SimulatedRank("burst", rank, 12, cap=512) for rank in range(12)]
    bodies = [json.dumps(rank.report(T0, T0 + 5, [100])).encode() for rank in ranks]
    pending_seen: list[int] = []

    async def burst() -> list[httpx.Response]:
        release = _block_writer(store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost", headers=JSON) as client:
            requests = [asyncio.ensure_future(client.post("/v1/reports", content=body)) for body in bodies]
            while sum(request.done() for request in requests) < len(bodies) - BOUND:
                pending_seen.append(store.pending_reports)
                await asyncio.sleep(0.01)
            pending_seen.append(store.pending_reports)
            release.set()
            return await asyncio.gather(*requests)

    try:
        responses = asyncio.run(burst())
        codes = sorted(response.status_code for response in responses)
        assert codes == [202] * BOUND + [503] * (len(bodies) - BOUND)
        busy = [response for response in responses if response.status_code == 503]
        assert all(response.headers["retry-after"] == "1" for response in busy)
        assert all("retry later" in response.json()["detail"] for response in busy)
        assert max(pending_seen) == BOUND
        assert store.report_count() == BOUND and store.pending_reports == 0
    finally:
        store.close()


def test_a_submit_racing_close_is_refused_not_left_waiting(tmp_path):
    """The submit reads the clock, then queues: a close landing in between used to put the stop
    sentinel ahead of the report, which then waited forever."""
    closer: list[threading.Thread] = []

    class ClosingClock(FakeClock):
        def __call__(self) -> float:
            if threading.current_thread() is threading.main_thread() and not closer:
                closer.append(threading.Thread(target=store.close))
                closer[0].start()
                closer[0].join(10)
            return super().__call__()

    store = Store(tmp_path / "race.db", StoreOptions(), ClosingClock())
    future = store.submit(_reports(1)[0])  # no received time: the submit reads the clock
    with pytest.raises(StoreUnavailable):
        future.result(timeout=5)
    assert store.pending_reports == 0


def test_many_submits_racing_close_all_settle(tmp_path):
    store = Store(tmp_path / "many.db", StoreOptions(), FakeClock())
    reports = _reports(400)
    futures: list[concurrent.futures.Future] = []
    started = threading.Barrier(3)

    def submit_half(half: list[RankReport]) -> None:
        started.wait()
        futures.extend(store.submit(report, T0) for report in half)

    threads = [threading.Thread(target=submit_half, args=(reports[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    started.wait()
    store.close()
    for thread in threads:
        thread.join(10)
    done, not_done = concurrent.futures.wait(futures, timeout=10)
    assert not not_done and len(done) == 400
    stored = sum(1 for future in done if future.exception() is None)
    assert store.pending_reports == 0
    reopened = Store(tmp_path / "many.db", StoreOptions(), FakeClock())
    try:
        assert reopened.report_count() == stored  # what was acknowledged is stored, nothing else
    finally:
        reopened.close()


def test_writer_calls_after_close_are_refused_not_left_waiting(tmp_path):
    store = Store(tmp_path / "after.db", StoreOptions(), FakeClock())
    store.close()
    with pytest.raises(StoreUnavailable):
        store.run_in_writer(lambda connection: None).result(timeout=5)
