"""Every report the service accepts can be priced and advised, in every FlashInfer layout, and a
group whose advice cannot be computed is isolated: it shows its error, the others keep working.

The 0.7.4 case goes through HTTP end to end and is checked byte for byte against ``capwatch plan``."""

from __future__ import annotations

import json

import pytest

from tests.support.launcher import run_capwatch
from tests.support.simulate import SimulatedRank
from capwatch.backends.flashinfer import FlashInferParams
from capwatch.telemetry.rank import rank_config
from tests.service.conftest import T0

WINDOW_S = 60.0
EP_SIZE = 8
CAP = 1024


def post(client, report):
    return client.post("/v1/reports", content=json.dumps(report))


def with_config(report: dict, **config) -> dict:
    """``report`` with these config fields; a whole config's FlashInfer parameters (``flashinfer``) replace those
    the simulated rank sends at the top level (a body gives them in one place)."""
    kept = {name: value for name, value in report["config"].items()
            if "flashinfer" not in config or name not in FlashInferParams.model_fields}
    return {**report, "config": {**kept, **config}}


def priced_config(ep_size: int, version: str | None, **geometry) -> dict:
    values = dict(cap=CAP, hidden_size=7168, top_k=8, num_experts=256, backend="simulated")
    values.update(geometry)
    return rank_config(ep_size=ep_size, flashinfer_version=version, **values).model_dump(exclude_none=True)


def feed(client, clock, cluster: str, version: str | None, windows: int = 30, ep_size: int = EP_SIZE,
         peak_of=lambda window: 600 + 40 * (window % 5)) -> None:
    ranks = [SimulatedRank(cluster, rank, ep_size, cap=CAP) for rank in range(ep_size)]
    config = priced_config(ep_size, version)
    for window in range(windows):
        begin = T0 + window * WINDOW_S
        clock.now = begin + WINDOW_S
        for rank in ranks:
            peak = peak_of(window)
            response = post(client, with_config(rank.report(begin, begin + WINDOW_S - 1, [peak // 2, peak]), **config))
            assert response.status_code == 202, response.text


def plan_json(*args: str) -> dict:
    result = run_capwatch("plan", "--json", *args, timeout_s=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_rank_on_flashinfer_0_7_4_reports_is_priced_and_advised_as_plan_prices_it(client, clock):
    feed(client, clock, "nv", "0.7.4")
    advice = client.get("/v1/clusters/nv/advice")
    assert advice.status_code == 200, advice.text
    advice = advice.json()
    assert advice["action"] in ("raise", "lower", "hold") and advice["recommended_cap"] is not None
    common = ("--model", "deepseek-v3", "--ep-size", str(EP_SIZE), "--flashinfer-version", "0.7.4")
    current = plan_json(*common, "--cap", str(CAP))
    recommended = plan_json(*common, "--cap", str(advice["recommended_cap"]))
    assert current["layout"] == "nvlink_one_sided"
    assert advice["workspace_bytes_per_rank_current"] == current["workspace_bytes_per_rank"]
    assert advice["workspace_bytes_group_current"] == current["workspace_bytes_group"]
    assert advice["workspace_bytes_per_rank_recommended"] == recommended["workspace_bytes_per_rank"]
    whatif = client.get("/v1/clusters/nv/whatif", params={"cap": [2048]}).json()
    assert whatif[0]["workspace_bytes_per_rank"] == plan_json(*common, "--cap", "2048")["workspace_bytes_per_rank"]
    view = client.get("/v1/clusters/nv").json()
    assert view["workspace_bytes_per_rank"] == current["workspace_bytes_per_rank"]
    assert [finding["kind"] for finding in view["findings"]] == []  # the reported bytes are the formula's


def test_the_moe_a2a_layout_prices_as_plan_prices_it(client, clock):
    feed(client, clock, "a2a", "0.6.16", windows=3)
    view = client.get("/v1/clusters/a2a").json()
    expected = plan_json("--model", "deepseek-v3", "--ep-size", str(EP_SIZE), "--flashinfer-version", "0.6.16",
                         "--cap", str(CAP))
    assert expected["layout"] == "moe_a2a" and view["workspace_bytes_per_rank"] == expected["workspace_bytes_per_rank"]


@pytest.mark.parametrize(("config", "field", "words"), [
    # Sent at the top level (the rank's FlashInfer parameters before they moved under config.flashinfer), they
    # are read as config.flashinfer's and named there.
    ({"flashinfer_version": "9.9.9"}, "config.flashinfer.flashinfer_version", "9.9.9"),
    ({"flashinfer_version": "latest"}, "config.flashinfer.flashinfer_version", "X.Y.Z"),
    ({"flashinfer_version": "0.6.10", "eplb_stats_num_experts": 16}, "config.flashinfer.eplb_stats_num_experts",
     "0.6.16"),
    ({"eplb_stats_num_experts": 300}, "config", "num_experts"),
    ({"flashinfer_version": "0.6.0", "top_k": 9}, "config", "kMaxTopK"),
    ({"flashinfer_version": "0.7.4", "top_k": 5}, "config", "top_k"),
    ({"payload_format": "nvfp4", "hidden_size": 7000}, "config", "multiple of 16"),
])
def test_a_config_flashinfer_would_refuse_gets_422_naming_the_field(client, store, config, field, words):
    report = with_config(SimulatedRank("v1", 0, EP_SIZE, cap=CAP).report(T0, T0 + 10, [100]), **config)
    response = post(client, report)
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert any(error["field"] == field and words in error["message"] for error in errors), errors
    assert store.report_count() == 0


def test_a_group_its_release_cannot_hold_is_refused(client, store):
    # 0.7.2.post1's moe_a2a has at most 64 ranks; 0.7.4's NVLinkOneSidedAlltoAll takes up to 256.
    report = SimulatedRank("wide", 0, EP_SIZE, cap=CAP).report(T0, T0 + 10, [100])
    report["identity"]["ep_size"] = 128
    response = post(client, report)
    assert response.status_code == 422 and "64" in response.json()["detail"], response.text
    accepted = post(client, with_config(report, **priced_config(128, "0.7.4")))
    assert accepted.status_code == 202, accepted.text


def test_a_group_whose_ranks_cannot_be_priced_together_shows_its_error_and_nothing_else_breaks(client, clock):
    feed(client, clock, "good", None, windows=3)
    # Each report prices on its own; together (the widest cap's config in the widest group) they do not:
    # 4 experts cannot spread over the 8 ranks another rank reports.
    narrow = SimulatedRank("bad", 0, 2, cap=2048, num_experts=4, top_k=2)
    wide = SimulatedRank("bad", 1, 8, cap=512)
    clock.now = T0 + 200
    assert post(client, narrow.report(T0 + 100, T0 + 150, [100])).status_code == 202
    assert post(client, wide.report(T0 + 100, T0 + 150, [100])).status_code == 202
    advice = client.get("/v1/clusters/bad/advice")
    assert advice.status_code == 409 and "bad" in advice.json()["detail"], advice.text
    assert client.get("/v1/clusters/bad/whatif", params={"cap": [1024]}).status_code == 409
    assert client.get("/v1/clusters/bad").status_code == 200
    listed = client.get("/v1/clusters")
    assert listed.status_code == 200
    by_name = {entry["cluster"]: entry for entry in listed.json()}
    assert by_name["bad"]["error"] and by_name["bad"]["action"] is None
    assert by_name["good"]["error"] is None and by_name["good"]["action"] is not None
    assert client.get("/v1/clusters/good/advice").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and 'capwatch_cluster_cap_tokens{dispatcher="target",ep_group="good"' in metrics.text
