"""``ReportFastPath`` serves accepted reports without the router; everything else must reach the
documented route and get the same answer as before. Each test drives the real app (fast path in
front) and checks both what the client sees and what the store holds."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from capwatch.service.config import Settings
from capwatch.service.main import create_app
from tests.support.simulate import SimulatedRank
from capwatch.service.store.sqlite import Store
from tests.service.conftest import JSON, T0


def _metric(client: TestClient, line_start: str) -> float:
    [line] = [line for line in client.get("/metrics").text.splitlines() if line.startswith(line_start)]
    return float(line.rsplit(" ", 1)[1])


def test_accepted_and_duplicate_reports_are_acknowledged_and_counted(client, store):
    body = json.dumps(SimulatedRank("f1", 0, 1, cap=512).report(T0, T0 + 5, [100, 200])).encode()
    first = client.post("/v1/reports", content=body)
    again = client.post("/v1/reports", content=body)
    assert (first.status_code, first.json()) == (202, {"accepted": True, "duplicate": False})
    assert first.headers["content-type"] == "application/json"
    assert (again.status_code, again.json()) == (200, {"accepted": True, "duplicate": True})
    assert store.report_count() == 1
    assert store._reader().execute("SELECT payload FROM reports").fetchone()[0] == body.decode()  # as received
    assert _metric(client, "capwatch_reports_ingested_total") == 1
    assert _metric(client, "capwatch_reports_duplicate_total") == 1
    assert _metric(client, "capwatch_ingest_latency_seconds_count") == 2


def test_a_body_without_content_length_goes_through_the_route(client, store):
    body = json.dumps(SimulatedRank("f2", 0, 1, cap=512).report(T0, T0 + 5, [100])).encode()
    response = client.post("/v1/reports", content=iter([body[:100], body[100:]]))  # chunked: no length
    assert response.status_code == 202 and store.report_count() == 1


def test_an_invalid_report_is_refused_by_the_route_with_the_field_named(client, store):
    report = SimulatedRank("f3", 0, 1, cap=512).report(T0, T0 + 5, [100])
    report["interval"]["peak_runtime_tokens"] = -1
    response = client.post("/v1/reports", content=json.dumps(report))
    assert response.status_code == 422
    assert "interval.peak_runtime_tokens" in response.json()["detail"]
    assert store.report_count() == 0
    assert _metric(client, 'capwatch_reports_rejected_total{reason="invalid"}') == 1


def test_a_declared_length_over_the_bound_gets_413_from_the_route(tmp_path, clock):
    settings = Settings(db_path=tmp_path / "c.db", max_body_bytes=2048)
    report = SimulatedRank("f4", 0, 1, cap=512).report(T0, T0 + 5, [100])
    report["final_reason"] = "x" * 1500
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost", headers=JSON) as client:
        response = client.post("/v1/reports", content=json.dumps(report))
        assert response.status_code == 413 and "2048" in response.json()["detail"]
        assert client.app.state.store.report_count() == 0


def test_a_token_is_checked_before_anything_is_read(tmp_path, clock):
    settings = Settings(db_path=tmp_path / "c.db", token="s3cret")
    body = json.dumps(SimulatedRank("f5", 0, 1, cap=512).report(T0, T0 + 5, [100]))
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost", headers=JSON) as client:
        assert client.post("/v1/reports", content=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        accepted = client.post("/v1/reports", content=body, headers={"Authorization": "Bearer s3cret"})
        assert accepted.status_code == 202
        assert client.app.state.store.report_count() == 1


def test_a_store_that_cannot_commit_gives_503_and_keeps_nothing(settings, clock):
    store = Store(settings.db_path, clock=clock)
    store.close()  # as if the disk went away: submissions are refused
    body = json.dumps(SimulatedRank("f6", 0, 1, cap=512).report(T0, T0 + 5, [100]))
    with TestClient(create_app(settings, store=store, clock=clock), base_url="http://localhost", headers=JSON) as client:
        response = client.post("/v1/reports", content=body)
        assert response.status_code == 503 and "retry later" in response.json()["detail"]
        assert _metric(client, 'capwatch_reports_rejected_total{reason="unavailable"}') == 1
    reopened = Store(settings.db_path, clock=clock)
    try:
        assert reopened.report_count() == 0
    finally:
        reopened.close()
