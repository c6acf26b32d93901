"""The database across versions and damage: a database written by the previous schema opens and
migrates; a damaged file is refused at start (one line, exit 2, naming the file); a row the code
cannot read is reported and worked around, never a traceback or a 500."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from fastapi.testclient import TestClient

from capwatch.service.config import Settings
from capwatch.service.main import create_app, store_options
from tests.support.launcher import run_capwatch
from tests.support.service import free_port
from tests.support.simulate import SimulatedRank
from capwatch.service.store.schema import SCHEMA_V1, SCHEMA_VERSION
from capwatch.service.store.errors import StoreDamaged
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport
from tests.service.conftest import JSON, T0, FakeClock


def _report(cluster: str, rank: int, start: float, peak: int = 300) -> RankReport:
    return RankReport.model_validate_json(json.dumps(
        SimulatedRank(cluster, rank, 2, cap=1024).report(start, start + 50, [100, peak])))


def _filled(path, clock, reports: int = 40) -> None:
    store = Store(path, clock=clock)
    try:
        for index in range(reports):
            store.ingest(_report("m1", index % 2, T0 + 30 * index), T0 + 30 * index + 55)
        store.maintain()
    finally:
        store.close()


def test_a_database_written_by_the_previous_schema_opens_and_migrates(tmp_path):
    path = tmp_path / "v1.db"
    legacy = sqlite3.connect(path)
    legacy.executescript(SCHEMA_V1)  # version 1 as it shipped, user_version never set (0)
    report = SimulatedRank("old", 0, 1, cap=512).report(T0, T0 + 10, [100, 200])
    legacy.execute(
        "INSERT INTO reports (cluster, role, ep_rank, boot_id, sequence, received_unix_s, interval_end_unix_s, "
        "peak_runtime_tokens, cap, forward_steps, overflow_events, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("old", "target", 0, report["identity"]["boot_id"], 0, T0 + 11, T0 + 10, 200, 512, 2, 0, json.dumps(report)))
    legacy.execute("INSERT INTO windows VALUES ('old', 'target', ?, 200, 512, 0, 1)", (T0 - T0 % 60,))
    legacy.commit()
    legacy.close()

    clock = FakeClock(T0 + 20)
    store = Store(path, clock=clock)
    try:
        assert store._reader().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        [state] = store.rank_states("old")
        assert state.config.cap == 512 and state.last_peak_runtime_tokens == 200  # replayed from the old rows
        assert store.sample_history("old", "target").sample_count == 1
        newer = SimulatedRank("old", 0, 1, cap=512, boot_id=report["identity"]["boot_id"], sequence=1)
        body = newer.report(T0 + 11, T0 + 19, [150])
        body["interval"]["max_local_tokens"] = 150
        assert store.ingest(RankReport.model_validate_json(json.dumps(body)), T0 + 20).accepted
        rows = store.interval_rows("old", "target", 0, T0 + 100, 10)
        assert [row.max_local_tokens for row in rows] == [None, 150]
    finally:
        store.close()
    reopened = Store(path, clock=clock)  # and it opens again at the current version, nothing to migrate
    try:
        assert reopened.rank_states("old")[0].sequence == 1
    finally:
        reopened.close()


def test_a_database_from_a_newer_capwatch_is_refused(tmp_path, clock):
    path = tmp_path / "new.db"
    Store(path, clock=clock).close()
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreDamaged, match="newer capwatch"):
        Store(path, clock=clock)


def _garble(path, offset: int, size: int = 64 << 10) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(bytes((index * 131 + 7) % 256 for index in range(size)))


def test_garbage_mid_file_is_refused_at_start(tmp_path, clock):
    path = tmp_path / "damaged.db"
    _filled(path, clock, reports=400)
    size = path.stat().st_size
    assert size > 3 * (64 << 10)
    _garble(path, size // 2)
    with pytest.raises(StoreDamaged, match="integrity"):
        Store(path, clock=clock)


def test_serve_refuses_a_damaged_database_with_one_line_and_exit_2(tmp_path, clock):
    path = tmp_path / "damaged.db"
    _filled(path, clock, reports=400)
    _garble(path, path.stat().st_size // 2)
    port = free_port()
    result = run_capwatch("serve", "--db", str(path), "--port", str(port), timeout_s=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "damaged" in lines[0] and "backup" in lines[0], lines


@pytest.mark.parametrize("tampered", ["'{\"cluster\": 1'", "json_remove(state, '$.config')", "'[1, 2]'"],
                         ids=["bad JSON", "no config", "not an object"])
def test_a_tampered_rank_state_is_reported_and_rebuilt_from_the_reports(tmp_path, clock, caplog, tampered):
    path = tmp_path / "tampered.db"
    _filled(path, clock)
    expected = None
    store = Store(path, clock=clock)
    expected = [state.to_dict() for state in store.rank_states("m1")]
    store.close()
    with sqlite3.connect(path) as connection:
        connection.execute(f"UPDATE ranks SET state = {tampered} WHERE ep_rank = 0")
        connection.execute("UPDATE ranks SET state = json_set(state, '$.config.cap', -5) WHERE ep_rank = 1")
    with caplog.at_level(logging.WARNING):
        store = Store(path, clock=clock)
    try:
        assert "cannot be read" in caplog.text
        assert [state.to_dict() for state in store.rank_states("m1")] == expected
    finally:
        store.close()


def test_a_tampered_folded_history_does_not_break_the_list(tmp_path):
    path = tmp_path / "folded.db"
    clock = FakeClock(T0)
    _filled(path, clock)
    clock.now = T0 + 7 * 3600  # every window older than the fold window
    store = Store(path, clock=clock)
    store.maintain()
    store.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("UPDATE folded SET history = '{\"usage\": 3}'").rowcount == 1
    settings = Settings(db_path=path, maintenance_interval_s=3600.0)
    store = Store(path, store_options(settings), clock)
    with TestClient(create_app(settings, store=store, clock=clock), base_url="http://localhost", headers=JSON) as client:
        assert client.get("/v1/clusters").status_code == 200
        assert client.get("/v1/clusters/m1/advice").status_code == 200
    store.close()
