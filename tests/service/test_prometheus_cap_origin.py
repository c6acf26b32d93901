"""Issue #32 items 4 and 5 through the Prometheus source: a real Prometheus scrapes real DeepEP rank exporters whose
``moe_a2a_sglang_info`` says who set the cap and the advice revision; the service reading it flags ranks that
disagree, and a cap below the decode CUDA-graph batch, as it does from reports (test_cap_origin.py)."""

from __future__ import annotations

import shutil

import pytest
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.service.config import Settings
from capwatch.service.main import create_app
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import model_geometry
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import ExporterOptions, RankExporter
from capwatch.telemetry.intervals import IntervalTracker
from capwatch.telemetry.rank import rank_config
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.telemetry.report import RankIdentity
from fastapi.testclient import TestClient

from tests.service.conftest import JSON
from tests.support.prometheus import scrape_config, start_prometheus
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus (make system-deps)")

GEOMETRY = model_geometry("deepseek-v3")
CAP = 128  # below the decode graph batch 96 x 2 tokens per request = 192
LIMITS = SGLangLimits(sglang_version="0.5.23", disaggregation_mode="decode", decode_cuda_graph_max_batch_size=96,
                      tokens_per_request=2)
GROUPS = {"prom-applied": [7, 7], "prom-split": [7, 6]}  # the advice revision capwatch applied, per rank


def _exporter(cluster: str, ep_rank: int, revision: int) -> RankExporter:
    plan = plan_deepep_buffer(GEOMETRY, 2, CAP, "auto")
    config = rank_config(
        cap=CAP, ep_size=2, hidden_size=GEOMETRY.hidden_size, top_k=GEOMETRY.top_k, num_experts=GEOMETRY.num_experts,
        backend="sglang-deepep", a2a_backend=DEEPEP.name, allocated_workspace_bytes=plan.buffer_bytes_per_rank,
        deepep=DeepEPBuffer(mode="auto", buffer_experts=plan.buffer_experts, normal_nvl_bytes=plan.normal_nvl_bytes,
                            normal_rdma_bytes=plan.normal_rdma_bytes),
        sglang=LIMITS.model_copy(update={"cap_source": "capwatch", "advice_revision": revision}))
    counters = DispatchCounters(CAP, 2, role="target")
    counters.record_step(100, 100)
    identity = RankIdentity(cluster=cluster, ep_rank=ep_rank, ep_size=2, role="target", boot_id=f"b{ep_rank}")
    exporter = RankExporter(DispatchCollector(IntervalTracker(counters), identity, config, interval_s=1.0))
    exporter.serve(ExporterOptions(base_port=0))
    return exporter


@pytest.fixture
def prometheus(tmp_path):
    exporters = [_exporter(cluster, rank, revision) for cluster, revisions in GROUPS.items()
                 for rank, revision in enumerate(revisions)]
    config = scrape_config([f"127.0.0.1:{exporter.port}" for exporter in exporters], job="ranks")
    try:
        with start_prometheus(tmp_path / "prometheus", config) as server:
            yield server.url
    finally:
        for exporter in exporters:
            exporter.close()


def test_who_set_the_cap_and_the_start_up_floor_through_prometheus(prometheus):
    settings = Settings(prometheus_url=prometheus, window_s=3.0, stale_after_s=10.0, missing_after_s=30.0)
    with TestClient(create_app(settings), base_url="http://localhost", headers=JSON) as client:
        wait_for(lambda: len(client.get("/v1/clusters").json()) == len(GROUPS) or None, 30, "both groups")
        views = {cluster: wait_for(lambda c=cluster: (lambda v: v if len(v["ranks"]) == 2 else None)(
            client.get(f"/v1/clusters/{c}").json()), 30, f"{cluster}'s ranks") for cluster in GROUPS}
        applied = {finding["kind"]: finding for finding in views["prom-applied"]["findings"]}
        split = {finding["kind"]: finding for finding in views["prom-split"]["findings"]}
        assert "cap_source_mismatch" not in applied and applied["cap_below_decode_graph"]["ranks"] == [0, 1]
        assert split["cap_source_mismatch"]["ranks"] == [1] and "revision 6" in split["cap_source_mismatch"]["message"]
        assert client.get("/v1/clusters/prom-applied/advice").json()["cap_origin"] == \
            "applied by capwatch at start (revision 7)"
        assert client.get("/v1/clusters/prom-split/advice").json()["cap_set_by"] == "mixed"
