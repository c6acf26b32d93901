"""A late report for a window already folded into the decaying histogram is kept raw (audit,
dedupe) but adds no second sample for that window, also after a restart; a late report for a
window not yet folded still counts."""

from __future__ import annotations

from capwatch.advisor.sample import window_start
from tests.support.simulate import SimulatedRank
from capwatch.service.store.options import StoreOptions
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport
from tests.service.conftest import T0, FakeClock

OPTIONS = StoreOptions(window_s=60.0, fold_after_s=3600.0, maintenance_interval_s=3600.0)


def _report(rank: SimulatedRank, start: float, peak: int) -> RankReport:
    return RankReport.model_validate(rank.report(start, start + 30, [peak // 2, peak]), strict=False)


def _windows(store: Store) -> int:
    return store._reader().execute("SELECT count(*) FROM windows").fetchone()[0]


def test_a_late_report_for_a_folded_window_adds_no_second_sample(tmp_path):
    clock = FakeClock(T0 + 60)
    store = Store(tmp_path / "late.db", OPTIONS, clock)
    ranks = [SimulatedRank("late", rank, 2, cap=1024) for rank in range(2)]
    assert store.ingest(_report(ranks[0], T0, 400)).accepted
    clock.now = T0 + OPTIONS.fold_after_s + 600
    store.maintain()
    folded = store.sample_history("late", "target")
    assert folded.sample_count == 1 and _windows(store) == 0

    # rank 1's report for the same (folded) window arrives late, with a higher peak
    assert store.ingest(_report(ranks[1], T0, 900), received_unix_s=clock.now).accepted
    assert store.report_count() == 2  # kept raw
    assert _windows(store) == 0
    store.maintain()
    after = store.sample_history("late", "target")
    assert after.sample_count == 1 and after.max_peak_runtime_tokens == 400
    assert after.history_s == folded.history_s
    store.close()

    # the fold's progress survives a restart: still no second sample
    reopened = Store(tmp_path / "late.db", OPTIONS, clock)
    try:
        assert reopened.ingest(_report(ranks[1], T0 + 10, 700)).accepted
        reopened.maintain()
        assert reopened.sample_history("late", "target").sample_count == 1
    finally:
        reopened.close()


def test_a_late_report_for_a_window_not_yet_folded_still_counts(tmp_path):
    clock = FakeClock(T0 + 60)
    store = Store(tmp_path / "unfolded.db", OPTIONS, clock)
    ranks = [SimulatedRank("open", rank, 2, cap=1024) for rank in range(2)]
    try:
        assert store.ingest(_report(ranks[0], T0, 400)).accepted
        clock.now = T0 + 600
        store.maintain()  # nothing old enough to fold yet
        assert store.ingest(_report(ranks[1], T0, 900)).accepted  # late, but its window is still open
        clock.now = T0 + OPTIONS.fold_after_s + 600
        store.maintain()
        history = store.sample_history("open", "target")
        assert history.sample_count == 1 and history.max_peak_runtime_tokens == 900
        assert history.first_sample_s == window_start(T0 + 30, OPTIONS.window_s)
    finally:
        store.close()
