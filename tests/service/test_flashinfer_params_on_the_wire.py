"""FlashInfer's parameters ride the wire as ``config.flashinfer`` (like DeepEP's ``config.deepep``), and a body of
before the move — ``payload_format``, ``flashinfer_version``, ``eplb_stats_num_experts`` at the config's top level,
as reports already stored in SQLite and older plugins send them — still reads the same: posted to the real
``capwatch serve`` (the installed product), both bodies give the same view and the same advice, priced by those
parameters (not their defaults)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from capwatch.backends.flashinfer import FlashInferParams
from capwatch.telemetry.report import RankReport
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, needs_service_venv
from tests.support.simulate import SimulatedRank

EP_SIZE = 2
CAP = 1024
WINDOWS = 12
# Parameters that change the price: an fp8 payload and an EPLB stats region (0.6.16 on).
PARAMS = dict(payload_format="fp8", flashinfer_version="0.7.2.post1", eplb_stats_num_experts=64)


def legacy_body(rank: SimulatedRank, start: float, peak: int) -> dict:
    """What a rank of the release before sends: its FlashInfer parameters at the config's top level."""
    body = rank.report(start, start + 0.9, [peak // 2, peak])
    body["config"].update(PARAMS)
    return body


def nested_body(body: dict, cluster: str) -> dict:
    """The same report as this release's plugin sends it: the parameters under ``config.flashinfer``."""
    config = {name: value for name, value in body["config"].items() if name not in FlashInferParams.model_fields}
    config["flashinfer"] = {name: body["config"][name] for name in FlashInferParams.model_fields
                            if name in body["config"]}  # the fields a body of before the move had
    return {**body, "identity": {**body["identity"], "cluster": cluster}, "config": config}


def parse(body: dict) -> RankReport:
    """The body as the service reads it (JSON)."""
    return RankReport.model_validate_json(json.dumps(body))


def _request(url: str, body: dict | None = None):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def _without_names(value, cluster: str):
    """``value`` with its cluster's name and the times it was posted and computed left out (the two clusters
    differ there)."""
    if isinstance(value, dict):
        return {key: _without_names(item, cluster) for key, item in value.items()
                if key not in ("cluster", "boot_id") and not key.endswith(("_unix_s", "seconds_since_report"))}
    if isinstance(value, list):
        return [_without_names(item, cluster) for item in value]
    return value.replace(cluster, "<cluster>") if isinstance(value, str) else value


@needs_service_venv
def test_a_body_of_before_the_move_reads_as_the_nested_one_and_gets_the_same_advice(tmp_path):
    env = {"CAPWATCH_WINDOW_S": "1", "CAPWATCH_ADVISOR__MIN_SAMPLES": "3", "CAPWATCH_ADVISOR__MIN_HISTORY_S": "2",
           "CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S": "2"}
    ranks = [SimulatedRank("legacy", rank, EP_SIZE, cap=CAP, payload_format="fp8") for rank in range(EP_SIZE)]
    with ServiceProcess(tmp_path / "capwatch.db", env=env, python=INSTALLED_PYTHON, cwd=tmp_path) as service:
        start = time.time() - WINDOWS - 1
        for window in range(WINDOWS):
            for rank in ranks:
                body = legacy_body(rank, start + window, 200 + 10 * window)
                parsed = parse(body)  # the body this test posts reads as the nested one
                assert parsed.config.flashinfer == FlashInferParams(**PARAMS)
                assert parse(nested_body(body, "legacy")) == parsed
                for cluster, posted in (("legacy", body), ("nested", nested_body(body, "nested"))):
                    status, answer = _request(f"{service.url}/v1/reports", posted)
                    assert status == 202, answer
        views, advice = {}, {}
        deadline = time.monotonic() + 30
        for cluster in ("legacy", "nested"):
            while True:
                _, views[cluster] = _request(f"{service.url}/v1/clusters/{cluster}")
                status, advice[cluster] = _request(f"{service.url}/v1/clusters/{cluster}/advice")
                if advice[cluster].get("action") is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    assert advice["legacy"]["action"] == "lower", advice["legacy"]  # peaks far below the cap
    assert _without_names(advice["legacy"], "legacy") == _without_names(advice["nested"], "nested")
    assert _without_names(views["legacy"], "legacy") == _without_names(views["nested"], "nested")
    # Priced by the parameters sent, not by the defaults (bf16, no stats region).
    from capwatch.backends import pricing_of
    config = parse(legacy_body(ranks[0], time.time(), 100)).config
    default = config.model_copy(update={"flashinfer": FlashInferParams()})
    assert pricing_of(config, EP_SIZE).bytes_per_rank(CAP) != pricing_of(default, EP_SIZE).bytes_per_rank(CAP)
    assert {rank["expected_workspace_bytes_per_rank"] for rank in views["legacy"]["ranks"]} == {
        pricing_of(config, EP_SIZE).bytes_per_rank(CAP)}


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
