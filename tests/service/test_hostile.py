"""The hostile cases of the hardening issue, kept as tests: what no accepted report, foreign page,
duplicate header or bad row may do to the service. Each runs the real app and a real SQLite store."""

from __future__ import annotations

import asyncio
import json

import pytest
from capwatch.service.store.errors import ReportNotStorable
from capwatch.sizing.flashinfer_releases import SUPPORTED_FLASHINFER_VERSIONS
from capwatch.telemetry.report import MAX_COUNT, RankReport
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.service.conftest import JSON, T0
from tests.support.simulate import SimulatedRank

CHUNKED = "chunked"
DECLARED = "declared"


def send(client, body: bytes, way: str, **headers):
    """POST a report by one of the two ways in: a declared length (the fast path) or chunked (the route)."""
    content = body if way == DECLARED else iter([body[: len(body) // 2], body[len(body) // 2:]])
    return client.post("/v1/reports", content=content, headers={**JSON, **headers})


def report(cluster: str = "h1", **interval) -> dict:
    body = SimulatedRank(cluster, 0, 4, cap=1024).report(T0, T0 + 10, [100, 300])
    body["interval"].update(interval)
    return body


# --- one set of rules, both ways in ------------------------------------------------------------


@pytest.mark.parametrize("mutate,status,words", [
    (lambda r: r["config"].update(flashinfer_version="9.9.9"), 422, "9.9.9"),
    (lambda r: r["identity"].update(cluster=".."), 422, "path step"),
    (lambda r: r["identity"].update(cluster="."), 422, "path step"),
    (lambda r: r["interval"].update(overflow_events=[{"kind": "runtime_over_cap", "outcome": "raised",
                                                      "count": 1 << 62}]), 422, "interval.overflow_events"),
    (lambda r: r["interval"].update(max_local_tokens=301), 422, "max_local_tokens"),
    (lambda r: r.update(sent_unix_s=0.0), 422, "clock"),
])
@pytest.mark.parametrize("way", [DECLARED, CHUNKED])
def test_both_ways_in_refuse_the_same_way(client, store, way, mutate, status, words):
    body = report()
    mutate(body)
    response = send(client, json.dumps(body).encode(), way)
    assert response.status_code == status and words in response.text, response.text
    assert store.report_count() == 0


@pytest.mark.parametrize("way", [DECLARED, CHUNKED])
def test_a_text_plain_post_from_a_foreign_page_is_refused_with_415(client, store, way):
    response = send(client, json.dumps(report()).encode(), way, **{"Content-Type": "text/plain"})
    assert response.status_code == 415 and "application/json" in response.json()["detail"]
    assert store.report_count() == 0


@pytest.mark.parametrize("way", [DECLARED, CHUNKED])
def test_two_authorization_headers_are_refused_on_every_path(tmp_path, clock, way):
    from capwatch.service.config import Settings
    from capwatch.service.main import create_app
    from fastapi.testclient import TestClient

    settings = Settings(db_path=tmp_path / "t.db", token="s3cret")
    twice = [("Authorization", "Bearer s3cret"), ("Authorization", "Bearer nope")]
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost") as client:
        body = json.dumps(report()).encode()
        content = body if way == DECLARED else iter([body])
        response = client.post("/v1/reports", content=content, headers=[("Content-Type", "application/json"), *twice])
        assert response.status_code == 400 and "one Authorization" in response.json()["detail"]
        assert client.get("/v1/clusters", headers=twice).status_code == 400
        assert client.app.state.store.report_count() == 0
        good = client.post("/v1/reports", content=content if way == DECLARED else iter([body]),
                           headers={**JSON, "Authorization": "Bearer s3cret"})
        assert good.status_code == 202


def test_a_foreign_host_is_refused_and_answers_carry_security_headers(client):
    assert client.get("/v1/clusters", headers={"Host": "rebound.example:8321"}).status_code == 421
    for path in ("/metrics", "/v1/clusters/x/advice", "/"):
        assert client.get(path, headers={"Host": "10.244.1.7:8321"}).status_code == 421


@pytest.mark.parametrize("host", ["10.244.1.7:8321", "[fd00::7]:8321", "rebound.example"])
def test_a_liveness_probe_is_answered_whatever_its_host(client, host):
    """Kubernetes' httpGet probe sends Host: <pod IP>:<port>; /healthz answers it (status only), nothing else does."""
    response = client.get("/healthz", headers={"Host": host})
    assert response.status_code == 200 and response.json()["status"] == "ok"
    assert client.post("/healthz", headers={"Host": host}).status_code == 421
    assert client.get("/healthz", headers={"Host": "127.0.0.1:8321@evil.example"}).status_code == 400
    for path in ("/", "/v1/clusters", "/web/app.js"):
        response = client.get(path)
        assert response.status_code == 200
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert client.get("/docs").status_code == 404  # Swagger UI would load a CDN's script: off by default


# --- sums that fit, and a bad row that fails only itself ----------------------------------------


def _maximal(cluster: str, rank: int) -> RankReport:
    body = SimulatedRank(cluster, rank, 8, cap=1024).report(T0, T0 + 10, [100])
    events = [{"kind": "runtime_over_cap", "outcome": outcome, "count": MAX_COUNT}
              for outcome in ("raised", "chunked")]
    body["interval"]["overflow_events"] = events
    body["counters"]["overflow_events"] = events
    return RankReport.model_validate_json(json.dumps(body))


def _submit_together(store, reports) -> list:
    async def together():
        return await asyncio.gather(*(store.submit_async(item, T0 + 20) for item in reports), return_exceptions=True)

    return asyncio.run(together())


def test_the_largest_legal_counts_commit_in_one_batch_with_every_other_report(store):
    good = [RankReport.model_validate_json(json.dumps(SimulatedRank("g", rank, 8, cap=1024).report(
        T0, T0 + 10, [100]))) for rank in range(8)]
    extreme = [_maximal("x", rank) for rank in range(8)]  # one window: its overflow sum saturates, never overflows
    results = _submit_together(store, [item for pair in zip(good, extreme) for item in pair])
    assert all(not isinstance(result, Exception) and result.accepted for result in results), results
    assert store.report_count() == 16
    [(overflows,)] = store._reader().execute("SELECT overflow_events FROM windows WHERE cluster = 'x'").fetchall()
    assert 16 * MAX_COUNT <= overflows < 1 << 63


def test_a_row_the_store_cannot_keep_fails_alone_and_its_batch_commits(store):
    good = [RankReport.model_validate_json(json.dumps(SimulatedRank("b", rank, 8, cap=1024).report(
        T0, T0 + 10, [100]))) for rank in range(6)]
    legal = json.loads(good[0].model_dump_json())
    # Past every bound (built without validation, as a bug upstream could): 2^64 fits no SQLite integer.
    legal["identity"]["cluster"] = "bad"
    unstorable = RankReport.model_validate_json(json.dumps(legal)).model_copy(
        update={"sequence": 1 << 64})
    results = _submit_together(store, [*good[:3], unstorable, *good[3:]])
    assert isinstance(results[3], ReportNotStorable)
    assert all(result.accepted for index, result in enumerate(results) if index != 3)
    assert store.report_count() == 6 and store.clusters() == ["b"]


# --- random schema-valid reports never take the read side down ----------------------------------

configs = st.fixed_dictionaries({
    "flashinfer_version": st.sampled_from([None, *SUPPORTED_FLASHINFER_VERSIONS]),
    "eplb_stats_num_experts": st.sampled_from([0, 0, 8, 256, 4096]),
    "top_k": st.sampled_from([1, 2, 5, 8, 9, 22]),
    "num_experts": st.sampled_from([4, 8, 256, 300, 4096]),
    "hidden_size": st.sampled_from([1, 7000, 7168, 65536]),
    "payload_format": st.sampled_from(["bf16", "fp8", "nvfp4", "mxfp8", "mxfp4", "deepseek-fp8"]),
    "cap": st.sampled_from([1, 128, 1024, 1 << 20]),
    "dispatch_bytes_per_token": st.integers(1, 1 << 24),
})
groups = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 2, 8, 64, 128, 255]), configs),
                  min_size=1, max_size=6)


@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(reports=groups)
def test_random_schema_valid_reports_never_break_the_read_side_of_another_cluster(tmp_path_factory, reports):
    from capwatch.service.config import Settings
    from capwatch.service.main import create_app
    from fastapi.testclient import TestClient

    from tests.service.conftest import FakeClock

    clock = FakeClock(T0 + 60)
    settings = Settings(db_path=tmp_path_factory.mktemp("fuzz") / "c.db")
    with TestClient(create_app(settings, clock=clock), base_url="http://localhost", headers=JSON) as client:
        control = SimulatedRank("control", 0, 1, cap=1024)
        assert client.post("/v1/reports", content=json.dumps(control.report(T0, T0 + 30, [100]))).status_code == 202
        for index, (cluster, ep_size, config) in enumerate(reports):
            rank = SimulatedRank(f"r{cluster}", index % ep_size, ep_size if ep_size <= 64 else 8, cap=1024)
            body = rank.report(T0 + 1, T0 + 30, [min(50, config["cap"] + 1)])
            body["identity"]["ep_size"] = ep_size
            body["interval"]["runtime_tokens_histogram"] = [[min(50, config["cap"] + 1), 1]]
            body["config"].update(config)
            response = client.post("/v1/reports", content=json.dumps(body))
            assert response.status_code in (202, 422), response.text  # never a 5xx
        listed = client.get("/v1/clusters")
        assert listed.status_code == 200
        assert {entry["cluster"] for entry in listed.json()} >= {"control"}
        assert client.get("/v1/clusters/control/advice").status_code == 200
        assert client.get("/metrics").status_code == 200
        for entry in listed.json():
            for path in ("", "/advice", "/history", "/whatif?cap=1024"):
                response = client.get(f"/v1/clusters/{entry['cluster']}{path}")
                assert response.status_code in (200, 409), (path, response.text)


@pytest.mark.parametrize("way", [DECLARED, CHUNKED])
def test_a_post_from_a_foreign_origin_is_refused_and_the_own_origin_is_not(client, store, way):
    body = json.dumps(report("o1")).encode()
    foreign = send(client, body, way, Origin="http://127.0.0.1:9999")
    assert foreign.status_code == 403 and "web pages" in foreign.json()["detail"]
    assert store.report_count() == 0
    assert send(client, body, way, Origin="http://localhost").status_code == 202  # the service's own page


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.one_of(
    st.binary(max_size=300),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                 max_leaves=20).map(lambda value: json.dumps(value).encode()),
    st.builds(lambda path, value: _mutated(path, value),
              st.sampled_from([("config", "cap"), ("identity", "cluster"), ("interval", "forward_steps"),
                               ("counters", "overflow_events"), ("sequence",), ("config", "sglang")]),
              st.one_of(st.integers(-2, 1 << 64), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)))))
def test_fuzzed_bodies_get_the_same_answer_both_ways_in(client, body):
    declared, chunked = send(client, body, DECLARED), send(client, body, CHUNKED)
    if declared.status_code == 202:  # stored by the first: the second is its duplicate
        assert chunked.status_code == 200
        return
    assert declared.status_code < 500 and declared.status_code == chunked.status_code
    if declared.status_code == 422:
        assert declared.json() == chunked.json()


def _mutated(path: tuple, value) -> bytes:
    body = report("fz")
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(body).encode()


# --- issue #20's minor points: one header of each kind, a Host that is a host, headers on a 500 ---------------


@pytest.mark.parametrize("name, values", [
    ("Origin", ["http://evil.example", "http://localhost"]),  # was last-wins on the fast path: 202
    ("Content-Type", ["text/plain", "application/json"]),
    ("Host", ["localhost", "localhost"]),
])
@pytest.mark.parametrize("way", [DECLARED, CHUNKED])
def test_a_header_a_rule_reads_is_given_once_or_refused(client, store, name, values, way):
    body = json.dumps(report("dup")).encode()
    headers = [("Content-Type", "application/json")] if name != "Content-Type" else []
    headers += [(name, value) for value in values]
    content = body if way == DECLARED else iter([body])
    response = client.post("/v1/reports", content=content, headers=headers)
    assert response.status_code == 400 and f"one {name} header" in response.json()["detail"], response.text
    assert store.report_count() == 0


@pytest.mark.parametrize("host", ["127.0.0.1:8321@evil.example", "localhost/evil", "localhost:80:80", "[::1",
                                  "local host", ""])
def test_a_host_header_that_is_not_a_host_is_refused(client, host):
    response = client.get("/v1/clusters", headers={"Host": host})
    assert response.status_code == 400 and "is not a host name or address" in response.json()["detail"]
    assert response.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("host", ["localhost", "localhost:8321", "127.0.0.1:1", "[::1]:8321", "LOCALHOST"])
def test_a_loopback_host_with_or_without_port_is_served(client, host):
    assert client.get("/healthz", headers={"Host": host}).status_code == 200


def test_a_500_answer_carries_the_security_headers(tmp_path):
    from capwatch.service.config import Settings
    from capwatch.service.main import create_app
    from fastapi.testclient import TestClient

    class BrokenSource:  # a read that fails in a way no handler expects: Starlette's own 500
        def changes(self):
            return None

        def clusters(self):
            return ["x"]

        def rank_states(self, cluster):
            raise RuntimeError("the disk went away")

    app = create_app(Settings(db_path=tmp_path / "t.db"), source=BrokenSource())
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        response = client.get("/v1/clusters/x")
    assert response.status_code == 500
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


def test_reads_need_the_token_when_the_service_says_so(tmp_path):
    from capwatch.service.config import Settings
    from capwatch.service.main import create_app
    from fastapi.testclient import TestClient

    settings = Settings(db_path=tmp_path / "t.db", token="s3cret", reads_need_token=True)
    bearer = {"Authorization": "Bearer s3cret"}
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        body = json.dumps(SimulatedRank("r", 0, 1, cap=1024).report(T0, T0 + 10, [100])).encode()
        client.app.state.clock = lambda: T0 + 20
        assert client.post("/v1/reports", content=body, headers={**JSON, **bearer}).status_code == 202
        for path in ("/v1/clusters", "/v1/clusters/r", "/v1/clusters/r/advice", "/v1/clusters/r/history",
                     "/v1/clusters/r/whatif?cap=1024", "/metrics"):
            refused = client.get(path)
            assert refused.status_code == 401 and "CAPWATCH_READS_NEED_TOKEN" in refused.json()["detail"], path
            assert refused.headers["www-authenticate"] == "Bearer"
            assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
            assert client.get(path, headers=bearer).status_code == 200, path
        for path in ("/healthz", "/", "/web/app.js", "/openapi.json"):  # no data in them: open
            assert client.get(path).status_code == 200, path
    with pytest.raises(ValueError, match="needs a token"):
        Settings(db_path=tmp_path / "t.db", reads_need_token=True)
