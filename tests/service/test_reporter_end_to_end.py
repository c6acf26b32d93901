"""Telemetry's real reporter posting to a real ``capwatch serve``: the schemas agree, a token is
honoured, and the service's view is the ranks' counters."""

from __future__ import annotations

import time

import httpx

from capwatch.dispatcher.counters import DispatchCounters
from tests.support.service import ServiceProcess
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import RankReporter, ReporterOptions, new_boot_id

EP_SIZE = 2
CAP = 512


def test_reporters_feed_the_service(tmp_path):
    with ServiceProcess(tmp_path / "capwatch.db", env={"CAPWATCH_TOKEN": "s3cret"}) as server:
        reporters, counters = [], []
        for rank in range(EP_SIZE):
            rank_counters = DispatchCounters(CAP, EP_SIZE, role="target")
            identity = RankIdentity(cluster="e2e", ep_rank=rank, ep_size=EP_SIZE, boot_id=new_boot_id())
            config = rank_config(cap=CAP, ep_size=EP_SIZE, hidden_size=1024, top_k=4, num_experts=8, backend="torch")
            options = ReporterOptions(service_url=server.url, interval_s=0.2, bearer_token="s3cret")
            reporters.append(RankReporter(rank_counters, identity, config, options).start())
            counters.append(rank_counters)
        try:
            for step in range(50):
                for rank, rank_counters in enumerate(counters):
                    rank_counters.record_step(400 if (rank, step) == (1, 30) else 100 + step)
                time.sleep(0.01)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                view = httpx.get(f"{server.url}/v1/clusters/e2e").json()
                if view.get("ranks") and sum(rank["forward_steps_total"] for rank in view["ranks"]) == 100:
                    break
                time.sleep(0.2)
            assert [rank["state"] for rank in view["ranks"]] == ["reporting", "reporting"]
            assert [rank["forward_steps_total"] for rank in view["ranks"]] == [50, 50]
            assert view["group_max_runtime_tokens"] == 400 and view["findings"] == []
            assert view["workspace_bytes_per_rank"] == reporters[0].config.workspace_bytes_per_rank
            assert all(reporter.stats().rejected == 0 for reporter in reporters)
        finally:
            for reporter in reporters:
                reporter.close()
