"""The HTTP API against a real app, a real SQLite store and the report schema from telemetry."""

from __future__ import annotations

import json

import pytest
from capwatch.service.config import Settings
from capwatch.service.main import create_app
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import JSON, T0
from tests.support.simulate import SimulatedRank

WINDOW_S = 60.0


def post(client, report, **kwargs):
    return client.post("/v1/reports", content=json.dumps(report), **kwargs)


def feed(client, clock, ranks, windows, peak_of, start=T0):
    """Every rank reports once per window; the clock follows."""
    for window in range(windows):
        begin = start + window * WINDOW_S
        for rank in ranks:
            peak = peak_of(window, rank.ep_rank)
            clock.now = begin + WINDOW_S
            response = post(client, rank.report(begin, begin + WINDOW_S - 1, [peak // 2, peak]))
            assert response.status_code == 202, response.text


def test_a_valid_report_is_stored_and_shown(client, store):
    rank = SimulatedRank("c1", 0, 2, cap=1024)
    response = post(client, rank.report(T0, T0 + 10, [100, 300, 200]))
    assert response.status_code == 202 and response.json() == {"accepted": True, "duplicate": False}
    assert store.report_count() == 1
    view = client.get("/v1/clusters/c1").json()
    assert view["ranks"][0]["state"] == "reporting" and view["ranks"][0]["last_peak_runtime_tokens"] == 300
    assert view["ranks"][1]["state"] == "missing"  # rank 1 of 2 never reported
    assert [f["kind"] for f in view["findings"]] == ["missing_rank"] and view["findings"][0]["ranks"] == [1]
    assert client.get("/v1/clusters").json()[0]["cluster"] == "c1"


def _set(report, path, value):
    node = report
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@pytest.mark.parametrize("path,value,field", [
    (("counters", "forward_steps"), -1, "counters.forward_steps"),
    (("interval", "peak_runtime_tokens"), 3.0, "interval.peak_runtime_tokens"),  # a float is not a count
    (("identity", "ep_rank"), "0", "identity.ep_rank"),
    (("identity", "ep_rank"), 4, "identity"),  # rank >= ep_size
    (("config", "cap"), 1 << 30, "config.cap"),  # absurd
    (("config", "workspace_bytes_per_rank"), 1 << 50, "config.workspace_bytes_per_rank"),
    (("interval", "runtime_tokens_histogram"), [[100, 1], [50, 2]], "interval"),  # not ascending, wrong total
    (("interval", "runtime_tokens_histogram"), [[100, 1], [2000, 2]], "body"),  # bin above cap + 1
    (("interval", "forward_steps"), 5, "interval"),  # histogram holds 3 steps
    (("identity", "colour"), "red", "identity.colour"),  # unknown field
])
def test_bad_reports_get_422_naming_the_field_and_store_nothing(client, store, path, value, field):
    report = SimulatedRank("c1", 0, 4, cap=1024).report(T0, T0 + 10, [100, 300, 200])
    _set(report, path, value)
    response = post(client, report)
    assert response.status_code == 422, response.text
    body = response.json()
    assert field in [error["field"] for error in body["errors"]], body
    assert field.split(".")[0] in body["detail"] or field == "body"
    assert store.report_count() == 0 and client.get("/v1/clusters").json() == []


def test_nan_and_malformed_json_are_refused(client, store):
    text = json.dumps(SimulatedRank("c1", 0, 4, cap=1024).report(T0, T0 + 10, [1]))
    nan = text.replace(f'"sent_unix_s": {T0 + 10}', '"sent_unix_s": NaN')
    assert nan != text
    response = client.post("/v1/reports", content=nan)
    assert response.status_code == 422
    response = client.post("/v1/reports", content=text[:-5])
    assert response.status_code == 422 and response.json()["detail"] == "the body is not valid JSON"
    assert store.report_count() == 0


def test_duplicates_are_acknowledged_and_ignored(client, store):
    rank = SimulatedRank("c1", 0, 1, cap=1024)
    report = rank.report(T0, T0 + 10, [100, 200])
    assert post(client, report).status_code == 202
    duplicate = post(client, report)
    assert duplicate.status_code == 200 and duplicate.json() == {"accepted": True, "duplicate": True}
    assert store.report_count() == 1
    assert client.get("/v1/clusters/c1").json()["ranks"][0]["forward_steps_total"] == 2
    metrics = client.get("/metrics").text
    assert "capwatch_reports_ingested_total 1.0" in metrics and "capwatch_reports_duplicate_total 1.0" in metrics


def test_a_rank_restart_resets_counters_without_double_counting(client):
    rank = SimulatedRank("c1", 0, 1, cap=256)
    post(client, rank.report(T0, T0 + 10, [300]))  # one overflow
    post(client, rank.report(T0 + 10, T0 + 20, [100]))
    rank.restart()  # new boot id, sequence 0 again, cumulative counters from zero
    response = post(client, rank.report(T0 + 20, T0 + 30, [400]))
    assert response.json()["duplicate"] is False  # sequence 0 of a new boot is new
    view = client.get("/v1/clusters/c1").json()["ranks"][0]
    assert view["boots"] == 2 and view["overflow_events_total"] == 2 and view["forward_steps_total"] == 3
    assert view["max_runtime_tokens"] == 400


def test_write_endpoint_requires_the_token_when_set(tmp_path, clock):
    settings = Settings(db_path=tmp_path / "t.db", token="s3cret")
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost", headers=JSON) as client:
        report = SimulatedRank("c1", 0, 1, cap=1024).report(T0, T0 + 10, [1])
        assert post(client, report).status_code == 401
        assert post(client, report, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/v1/clusters").json() == []  # reads stay open; nothing was stored
        assert post(client, report, headers={"Authorization": "Bearer s3cret"}).status_code == 202
        assert 'capwatch_reports_rejected_total{reason="unauthorized"} 2.0' in client.get("/metrics").text


def test_body_limit_gives_413_and_stores_nothing(tmp_path, clock):
    settings = Settings(db_path=tmp_path / "t.db", max_body_bytes=2048)
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost", headers=JSON) as client:
        rank = SimulatedRank("c1", 0, 1, cap=4096)
        big = rank.report(T0, T0 + 10, list(range(1, 400)))
        assert len(json.dumps(big)) > 2048
        response = post(client, big)
        assert response.status_code == 413 and "2048" in response.json()["detail"]
        # a streamed body without Content-Length is cut off too
        response = client.post("/v1/reports", content=iter([json.dumps(big).encode()]))
        assert response.status_code == 413
        assert client.get("/v1/clusters").json() == []


def test_consistency_findings(client, clock):
    ranks = [SimulatedRank("c2", rank, 4, cap=1024) for rank in range(4)]
    ranks[1].cap = 2048  # disagrees on the cap
    ranks[2].ep_size = 8  # disagrees on ep_size
    ranks[3].workspace_multiplier = 4  # workspace sized for cap x ep_size
    for rank in ranks:
        assert post(client, rank.report(T0, T0 + 10, [100])).status_code == 202
    findings = {f["kind"]: f for f in client.get("/v1/clusters/c2").json()["findings"]}
    assert findings["cap_mismatch"]["ranks"] == [1] and findings["cap_mismatch"]["severity"] == "critical"
    assert findings["ep_size_mismatch"]["ranks"] == [2]
    assert findings["double_counted_workspace"]["ranks"] == [3]
    assert "4096 tokens" in findings["double_counted_workspace"]["message"]
    assert findings["missing_rank"]["ranks"] == [4, 5, 6, 7]  # ep_size 8 claimed by rank 2
    clock.now = T0 + 120  # past stale_after (60 s), not missing_after (300 s)
    post(client, ranks[0].report(T0 + 10, T0 + 110, [100]))
    view = client.get("/v1/clusters/c2").json()
    assert {r["ep_rank"]: r["state"] for r in view["ranks"]}[1] == "stale"
    assert view["ranks"][0]["state"] == "reporting"
    assert [1, 2, 3] == next(f for f in view["findings"] if f["kind"] == "stale_rank")["ranks"]


def test_advice_whatif_history_and_metrics(tmp_path, clock):
    # A full-confidence history of 30 min instead of a day, so 33 windows are enough to lower.
    settings = Settings(db_path=tmp_path / "a.db", advisor={"full_confidence_history_s": 1800.0})
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost", headers=JSON) as client:
        _advice_whatif_history_and_metrics(client, clock)


def _advice_whatif_history_and_metrics(client, clock):
    ranks = [SimulatedRank("c3", rank, 4, cap=4096) for rank in range(4)]
    assert client.get("/v1/clusters/c3/advice").status_code == 404
    feed(client, clock, ranks, 3, lambda w, r: 200)
    advice = client.get("/v1/clusters/c3/advice").json()
    assert advice["action"] == "insufficient_data" and advice["recommended_cap"] is None
    feed(client, clock, ranks, 30, lambda w, r: 300 if r == 2 else 150, start=T0 + 3 * WINDOW_S)
    advice = client.get("/v1/clusters/c3/advice").json()
    assert advice["action"] == "lower" and advice["recommended_cap"] == 384
    assert advice["env"] == "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK=384"
    assert advice["workspace_bytes_group_delta"] < 0 and advice["reasons"]
    rows = client.get("/v1/clusters/c3/whatif", params=[("cap", 256), ("cap", 512)]).json()
    assert rows[0]["cap"] == 256 and rows[0]["predicted_overflow_rate"] > 0.5 and rows[1]["predicted_overflow_rate"] == 0
    assert client.get("/v1/clusters/c3/whatif", params={"cap": 0}).status_code == 422
    history = client.get("/v1/clusters/c3/history", params={"since_s": T0, "until_s": T0 + 3600}).json()
    assert len(history["ranks"]) == 4 and len(history["ranks"][2]["points"]) == 33
    assert max(point["peak_runtime_tokens"] for point in history["group"]) == 300
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    value = {f"{s.name}{sorted(s.labels.items())}": s.value for f in families.values() for s in f.samples}
    assert value["capwatch_cluster_cap_tokens[('dispatcher', 'target'), ('ep_group', 'c3')]"] == 4096
    assert value["capwatch_recommended_cap_tokens[('dispatcher', 'target'), ('ep_group', 'c3')]"] == 384
    assert value["capwatch_advice_action[('action', 'lower'), ('dispatcher', 'target'), ('ep_group', 'c3')]"] == 1
    assert value["capwatch_ranks[('dispatcher', 'target'), ('ep_group', 'c3'), ('state', 'reporting')]"] == 4
    assert value["capwatch_consistency_findings[('dispatcher', 'target'), ('ep_group', 'c3'), ('finding', 'cap_mismatch')]"] == 0


def test_unknown_cluster_and_role_are_404(client):
    post(client, SimulatedRank("c4", 0, 1, cap=1024).report(T0, T0 + 10, [1]))
    response = client.get("/v1/clusters/nope/advice")
    assert response.status_code == 404 and "c4" in response.json()["detail"]
    assert client.get("/v1/clusters/c4", params={"role": "draft"}).status_code == 404
    assert client.get("/v1/clusters/c4", params={"role": "bogus"}).status_code == 422
    assert client.get("/v1/clusters/nope/history").status_code == 404
    assert client.get("/v1/clusters/c4/history", params={"role": "draft"}).status_code == 404


def test_folding_old_windows_keeps_the_advice_and_retention_drops_raw_reports(client, store, clock, settings):
    ranks = [SimulatedRank("c5", rank, 2, cap=2048) for rank in range(2)]
    feed(client, clock, ranks, 40, lambda w, r: 500 + 10 * (w % 7))
    before = client.get("/v1/clusters/c5/advice").json()
    clock.now += settings.fold_after_s + 120  # every window is now older than the fold window
    store.maintain()
    assert store._reader().execute("SELECT count(*) FROM windows").fetchone()[0] == 0
    after = client.get("/v1/clusters/c5/advice").json()
    assert {k: v for k, v in after.items() if k != "generated_unix_s"} == \
        {k: v for k, v in before.items() if k != "generated_unix_s"}
    assert store.report_count() == 80
    clock.now += settings.retention_s
    store.maintain()
    assert store.report_count() == 0
    # Silent for longer than the retention: the ranks are pruned, not listed as missing forever ...
    assert client.get("/v1/clusters/c5").status_code == 404 and client.get("/v1/clusters").json() == []
    # ... while the group's folded history is kept: a rank that comes back gets its advice from it.
    begin = clock.now - 30
    assert post(client, ranks[0].report(begin, begin + 20, [])).status_code == 202
    assert client.get("/v1/clusters/c5/advice").json()["sample_count"] == 40


def test_rank_states_not_yet_checkpointed_are_replayed_from_the_reports(tmp_path, clock):
    from capwatch.service.store.options import StoreOptions
    from capwatch.service.store.sqlite import Store

    options = StoreOptions(checkpoint_interval_s=3600.0)
    first = Store(tmp_path / "c.db", options, clock)
    rank = SimulatedRank("c6", 0, 1, cap=512)
    from capwatch.telemetry.report import RankReport
    for index in range(3):
        first.ingest(RankReport.model_validate(rank.report(T0 + index, T0 + index + 1, [100 * (index + 1)]),
                                               strict=False))
    # No checkpoint was written: a second store on the same file (as after a SIGKILL) replays the reports.
    second = Store(tmp_path / "c.db", options, clock)
    try:
        [state] = second.rank_states("c6")
        assert state.sequence == 2 and state.max_runtime_tokens == 300 and state.reports == 3
        assert state.to_dict() == first.rank_states("c6")[0].to_dict()
    finally:
        second.close()
        first.close()


def test_a_ranks_own_largest_local_batch_is_kept_and_shown(client, clock):
    rank = SimulatedRank("local", 0, 2, cap=1024)
    body = rank.report(T0, T0 + 10, [100, 300])
    body["interval"]["max_local_tokens"] = 250  # this rank's own batch; R = 300 is the group's
    assert post(client, body).status_code == 202
    view = client.get("/v1/clusters/local").json()
    assert view["ranks"][0]["last_max_local_tokens"] == 250 and view["ranks"][0]["max_local_tokens"] == 250
    history = client.get("/v1/clusters/local/history", params={"since_s": T0 - 1, "until_s": T0 + 100}).json()
    assert history["ranks"][0]["points"][0]["max_local_tokens"] == 250
    body = rank.report(T0 + 10, T0 + 20, [100])
    body["interval"]["max_local_tokens"] = 101  # more than R: impossible
    response = post(client, body)
    assert response.status_code == 422 and "max_local_tokens" in response.text


def test_head_of_the_page_answers_like_its_get(client):
    """Issue #36 (symptom 9): HEAD / answered 405 (uptime checks and curl -I use HEAD)."""
    head, get = client.head("/"), client.get("/")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
