"""A rank's clock is not trusted: a report whose times the service's clock contradicts is refused
with 422 naming the field, stores nothing and is counted as invalid, whether it came through the
fast path (declared length) or the route (chunked body)."""

from __future__ import annotations

import json

import pytest

from capwatch.service.api.routes.reports import clock_tolerance_s
from tests.support.simulate import SimulatedRank
from tests.service.conftest import T0


def _rejected_invalid(client) -> float:
    [line] = [line for line in client.get("/metrics").text.splitlines()
              if line.startswith('capwatch_reports_rejected_total{reason="invalid"}')]
    return float(line.rsplit(" ", 1)[1])


def _send(client, report: dict, chunked: bool):
    body = json.dumps(report).encode()
    content = iter([body[:50], body[50:]]) if chunked else body  # chunked: no length, so the route
    return client.post("/v1/reports", content=content)


@pytest.mark.parametrize("chunked", [False, True], ids=["fast_path", "route"])
def test_a_report_from_a_clock_at_the_epoch_is_refused_and_stores_nothing(client, store, clock, chunked):
    clock.now = T0 + 100
    report = SimulatedRank("skew", 0, 1, cap=512).report(0.0, 0.0, [300])  # end_unix_s=0: the reviewer's case
    response = _send(client, report, chunked)
    assert response.status_code == 422, response.text
    fields = {error["field"] for error in response.json()["errors"]}
    assert fields == {"sent_unix_s", "interval.start_unix_s", "interval.end_unix_s"}
    assert "interval.end_unix_s" in response.json()["detail"] and "NTP" in response.json()["detail"]
    assert store.report_count() == 0 and store.rank_states("skew") == []
    assert store.sample_history("skew", "target").sample_count == 0
    assert _rejected_invalid(client) == 1


@pytest.mark.parametrize("chunked", [False, True], ids=["fast_path", "route"])
def test_only_the_interval_end_in_the_future_is_named(client, store, clock, settings, chunked):
    tolerance = clock_tolerance_s(settings.window_s)
    report = SimulatedRank("future", 0, 1, cap=512).report(T0, T0 + tolerance + 5, [300])
    report["sent_unix_s"] = T0  # the send time is right; the interval's end is not
    response = _send(client, report, chunked)
    assert response.status_code == 422, response.text
    assert [error["field"] for error in response.json()["errors"]] == ["interval.end_unix_s"]
    assert store.report_count() == 0 and _rejected_invalid(client) == 1


def test_times_within_the_bounds_are_accepted(client, store, clock, settings):
    tolerance = clock_tolerance_s(settings.window_s)
    assert tolerance == max(600.0, 2 * settings.window_s)
    ahead = SimulatedRank("ok", 0, 2, cap=512).report(T0 + tolerance - 60, T0 + tolerance - 1, [300])
    # held back by the reporter while the service was unreachable: old, but within the retention
    backlog = SimulatedRank("ok", 1, 2, cap=512).report(T0 - settings.retention_s + 1, T0 - 3600, [300])
    assert client.post("/v1/reports", content=json.dumps(ahead)).status_code == 202
    assert client.post("/v1/reports", content=json.dumps(backlog)).status_code == 202
    assert store.report_count() == 2 and _rejected_invalid(client) == 0


def test_a_time_older_than_the_retention_is_refused(client, store, settings):
    report = SimulatedRank("old", 0, 1, cap=512).report(T0 - settings.retention_s - 10, T0 - 5, [300])
    response = client.post("/v1/reports", content=json.dumps(report))
    assert response.status_code == 422
    assert [error["field"] for error in response.json()["errors"]] == ["interval.start_unix_s"]
    assert store.report_count() == 0
