"""The store's batched write path: the reports one event-loop iteration submits are committed
together in a few many-row statements. Whatever the batching, the stored rows, windows, rank
states and acknowledgements must be those of committing the same reports one at a time."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.simulate import SimulatedRank
from capwatch.service.store.errors import StoreUnavailable
from capwatch.service.store.ingest import IngestResult
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport
from tests.service.conftest import T0, FakeClock

ACCEPTED = IngestResult(accepted=True, duplicate=False)
DUPLICATE = IngestResult(accepted=True, duplicate=True)


def _reports(ranks: int, intervals: int, cluster: str = "b1") -> list[RankReport]:
    simulated = [SimulatedRank(cluster, rank, ranks, cap=1024) for rank in range(ranks)]
    reports = []
    for index in range(intervals):
        for rank in simulated:
            start = T0 + 30.0 * index  # two reports per 60 s window: windows get several rows
            runtime_tokens = [] if (index + rank.ep_rank) % 5 == 0 else [100 + 7 * rank.ep_rank, 900 + index]
            reports.append(RankReport.model_validate(rank.report(start, start + 30.0, runtime_tokens), strict=False))
    return reports


def _submit_in_one_iteration(store: Store, reports: list[RankReport], clock: FakeClock) -> list:
    async def submit_all() -> list:
        futures = [store.submit_async(report, clock()) for report in reports]  # no await in between
        return await asyncio.gather(*futures, return_exceptions=True)

    return asyncio.run(submit_all())


def _contents(store: Store) -> dict:
    reader = store._reader()
    return {
        "reports": reader.execute(
            "SELECT cluster, role, ep_rank, boot_id, sequence, interval_end_unix_s, peak_runtime_tokens, cap, "
            "forward_steps, overflow_events, payload FROM reports ORDER BY id").fetchall(),
        "windows": reader.execute("SELECT * FROM windows ORDER BY cluster, role, window_start_s").fetchall(),
        "ranks": [state.to_dict() for state in store.rank_states("b1")],
    }


@pytest.fixture
def stores(tmp_path):
    opened = []

    def open_store(name: str, **options) -> Store:
        store = Store(tmp_path / f"{name}.db", StoreOptions(**options), FakeClock())
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def test_one_batch_stores_what_one_at_a_time_stores_and_flags_the_same_duplicates(stores):
    reports = _reports(ranks=6, intervals=4)
    stored_before = reports[:5]
    # Retries of stored reports, a retry inside the batch, and new reports, interleaved.
    incoming = [reports[2], *reports[5:12], reports[7], reports[0], *reports[12:]]
    expected = [DUPLICATE, *[ACCEPTED] * 7, DUPLICATE, DUPLICATE, *[ACCEPTED] * len(reports[12:])]

    one_at_a_time = stores("sequential")
    batched = stores("batched")
    for report in stored_before:
        assert one_at_a_time.ingest(report) == ACCEPTED
        assert batched.ingest(report) == ACCEPTED
    sequential_results = [one_at_a_time.ingest(report) for report in incoming]
    batched_results = _submit_in_one_iteration(batched, incoming, batched.clock)

    assert sequential_results == expected
    assert batched_results == expected
    assert _contents(batched) == _contents(one_at_a_time)
    assert batched.report_count() == len(reports)
    windows = _contents(batched)["windows"]
    assert sum(row[-1] for row in windows) == sum(1 for report in reports if report.interval.forward_steps > 0)
    assert any(row[-1] > 1 for row in windows)  # several reports did land in the same window


def test_a_batch_larger_than_one_statement_and_the_batch_bound(stores, monkeypatch):
    reports = _reports(ranks=64, intervals=10)  # 640 reports: more rows than one statement takes (512)
    reference = stores("sequential")
    for report in reports:
        reference.ingest(report)

    bounded = stores("bounded", max_batch_reports=100)
    batch_sizes = []
    commit = bounded._writer._commit
    monkeypatch.setattr(bounded._writer, "_commit", lambda batch: (batch_sizes.append(len(batch)), commit(batch)))
    assert _submit_in_one_iteration(bounded, reports, bounded.clock) == [ACCEPTED] * len(reports)
    assert max(batch_sizes) <= 100 and sum(batch_sizes) == len(reports)

    whole = stores("whole", max_batch_reports=1024)
    assert _submit_in_one_iteration(whole, reports, whole.clock) == [ACCEPTED] * len(reports)
    assert _contents(whole) == _contents(reference) == _contents(bounded)


def test_reports_gathered_when_the_store_closes_are_refused_not_lost(stores):
    store = stores("closing")
    [first, second] = _reports(ranks=1, intervals=2)

    async def submit_then_close() -> list:
        gathered = store.submit_async(first, store.clock())
        store.close()  # before the loop hands the gathered report to the writer
        late = store.submit_async(second, store.clock())
        return await asyncio.gather(gathered, late, return_exceptions=True)

    results = asyncio.run(submit_then_close())
    assert all(isinstance(result, StoreUnavailable) for result in results)
    reopened = stores("closing")
    assert reopened.report_count() == 0
