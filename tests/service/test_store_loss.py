"""Issue #20, finding 7: a database file deleted under the service went unnoticed: reports kept getting 202, /advice
and /history answered 500, and after a restart all 150 acknowledged reports were gone. And a `chattr +i` on the
database while running ended the service with SIGBUS. Against a real `capwatch serve`: the loss is noticed, no
report is acknowledged into a lost file (503, which ranks retry), reads that need the file answer 503, /healthz
says degraded, and the log says what happened, once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time

import httpx
import pytest

from tests.service.conftest import JSON
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank
from tests.support.waiting import wait_for


def post(client: httpx.Client, rank: SimulatedRank) -> httpx.Response:
    now = time.time()
    return client.post("/v1/reports", content=json.dumps(rank.report(now - 5, now, [100, 200])))


def noticed(client: httpx.Client, rank: SimulatedRank, words: str) -> httpx.Response:
    """The first report after the change (the writer looks before every commit): refused, saying what happened."""
    response = post(client, rank)
    assert response.status_code == 503, response.text
    assert words in response.json()["detail"] and response.headers["retry-after"] == "60"
    return response


def assert_lost_everywhere(service: ServiceProcess, client: httpx.Client, rank: SimulatedRank, words: str) -> None:
    assert all(post(client, rank).status_code == 503 for _ in range(5))  # and every one after it
    for path in ("/v1/clusters/loss/advice", "/v1/clusters/loss/history"):
        response = client.get(path)
        assert response.status_code == 503 and words in response.json()["detail"], (path, response.text)
    health = client.get("/healthz").json()
    assert health["status"] == "degraded" and words in health["problem"]
    # A Kubernetes probe (Host: the pod's IP, not an allowed name): the status, not the words naming the file.
    probe = client.get("/healthz", headers={"Host": "10.244.1.7:8321"})
    assert probe.status_code == 200 and probe.json() == {**health, "problem": None}
    assert "capwatch_store_database_lost 1.0" in client.get("/metrics").text
    log = service.log_path.read_text()
    assert log.count("Reports are refused from now on") == 1 and words in log
    assert service.running  # alive, and saying so: no SIGBUS, no crash


@pytest.fixture
def service(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    with ServiceProcess(folder / "capwatch.db", log_path=tmp_path / "service.log") as process:
        yield process


@pytest.fixture
def client(service):
    with httpx.Client(base_url=service.url, headers=JSON, timeout=30) as client:
        yield client


def test_a_deleted_database_is_noticed_and_nothing_is_acknowledged_into_it(service, client):
    rank = SimulatedRank("loss", 0, 1, cap=1024)
    assert all(post(client, rank).status_code == 202 for _ in range(20))
    for name in ("capwatch.db", "capwatch.db-wal", "capwatch.db-shm"):
        (service.db_path.parent / name).unlink(missing_ok=True)
    noticed(client, rank, "was deleted while the service ran")
    assert_lost_everywhere(service, client, rank, "was deleted while the service ran")
    assert not service.db_path.exists()  # no reader made a new, empty file in its place


def test_a_database_replaced_by_another_file_is_noticed(service, client, tmp_path):
    rank = SimulatedRank("loss", 0, 1, cap=1024)
    assert all(post(client, rank).status_code == 202 for _ in range(20))
    moved = tmp_path / "moved.db"
    shutil.copy(service.db_path, moved)
    os.replace(moved, service.db_path)  # another file under the same name (a restore from backup, say)
    noticed(client, rank, "was replaced by another file while the service ran")
    assert_lost_everywhere(service, client, rank, "was replaced by another file")


def test_a_deleted_write_ahead_log_is_noticed(service, client):
    rank = SimulatedRank("loss", 0, 1, cap=1024)
    assert all(post(client, rank).status_code == 202 for _ in range(20))
    (service.db_path.parent / "capwatch.db-wal").unlink()  # where every acknowledged report is, until checkpointed
    noticed(client, rank, "write-ahead log")
    assert_lost_everywhere(service, client, rank, "write-ahead log")


def test_an_immutable_database_is_noticed_and_the_service_lives_on(service, client):
    rank = SimulatedRank("loss", 0, 1, cap=1024)
    assert all(post(client, rank).status_code == 202 for _ in range(20))
    if subprocess.run(["chattr", "+i", str(service.db_path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here (needs root and a file system with the immutable flag); the "
                    "same check is the permission test of the database file (os.access), covered by the others")
    try:
        noticed(client, rank, "can no longer be written")
        assert_lost_everywhere(service, client, rank, "can no longer be written")
        wait_for(lambda: service.running, 1, "the service to be alive")
    finally:
        subprocess.run(["chattr", "-i", str(service.db_path)], capture_output=True)


def test_a_database_restored_by_mv_under_write_load_starts_and_loses_nothing(tmp_path):
    """Issue #36, finding 3 (F21): under write load, ``mv other.db capwatch.db`` (another closed capwatch database, an
    operator restoring a backup). The service left the replaced database's -wal and -shm at the path, and the next
    start read that log as the restored file's own: "damaged" in 5 of 5 runs, and in 2 the failed start wrote it into
    the restored file. Now every acknowledged report is kept in a copy beside it, the stale log is set aside, and the
    restored file starts as it is."""
    import sqlite3
    import threading

    backup = tmp_path / "backup" / "other.db"
    backup.parent.mkdir()
    with ServiceProcess(backup) as other, httpx.Client(base_url=other.url, headers=JSON, timeout=30) as client:
        restored_rank = SimulatedRank("restored", 0, 1, cap=1024)
        assert all(post(client, restored_rank).status_code == 202 for _ in range(30))
    assert not backup.with_name("other.db-wal").exists()  # a closed database: no log beside it

    folder = tmp_path / "state"
    folder.mkdir()
    acknowledged: list[tuple[str, int]] = []
    refused = threading.Event()
    with ServiceProcess(folder / "capwatch.db", log_path=tmp_path / "service.log") as service:
        def load() -> None:
            rank = SimulatedRank("live", 0, 1, cap=1024)
            with httpx.Client(base_url=service.url, headers=JSON, timeout=30) as client:
                while not refused.is_set():
                    now = time.time()
                    report = rank.report(now - 5, now, [100, 200])
                    status = client.post("/v1/reports", content=json.dumps(report)).status_code
                    if status == 202:
                        acknowledged.append((report["identity"]["boot_id"], report["sequence"]))
                    elif status == 503:
                        refused.set()

        loaders = [threading.Thread(target=load) for _ in range(4)]
        for thread in loaders:
            thread.start()
        wait_for(lambda: len(acknowledged) >= 200, 60, "reports acknowledged under load")
        os.replace(backup, service.db_path)  # the restore, under load
        assert refused.wait(30)
        for thread in loaders:
            thread.join(timeout=30)
        log = service.log_path.read_text()
    assert "was replaced by another file" in log and "capwatch serve --db" in log, log

    copies = sorted(folder.glob("capwatch.db.lost-*"))
    assert [copy.name for copy in copies if "-wal" not in copy.name and "-shm" not in copy.name] == \
        [copies[0].name], copies
    assert not (folder / "capwatch.db-wal").exists() or (folder / "capwatch.db-wal").stat().st_size == 0
    with contextlib.closing(sqlite3.connect(f"file:{copies[0]}?mode=ro", uri=True)) as kept:
        keys = set(kept.execute("SELECT json_extract(payload, '$.identity.boot_id'), json_extract(payload, "
                                "'$.sequence') FROM reports WHERE cluster = 'live'").fetchall())
    assert set(acknowledged) <= keys, f"{len(set(acknowledged) - keys)} acknowledged reports lost"

    with ServiceProcess(folder / "capwatch.db") as restarted:  # starts: not "damaged"
        with httpx.Client(base_url=restarted.url, timeout=30) as client:
            assert [cluster["cluster"] for cluster in client.get("/v1/clusters").json()] == ["restored"]
    with contextlib.closing(sqlite3.connect(f"file:{folder / 'capwatch.db'}?mode=ro", uri=True)) as restored:
        assert restored.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert restored.execute("SELECT COUNT(*) FROM reports WHERE cluster = 'restored'").fetchone() == (30,)
        assert restored.execute("SELECT COUNT(*) FROM reports WHERE cluster = 'live'").fetchone() == (0,)
