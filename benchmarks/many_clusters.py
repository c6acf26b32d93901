"""``GET /v1/clusters`` and ``/metrics`` with thousands of clusters (goal: <= 100 ms each).

A real store holds 3,000 EP groups of two ranks, each with a few windows of history; the app runs
in process (no network: the figure is the service's own work). Figures per endpoint: a cold call
(every group's digest computed; the service does this once in the background at start), a steady call (nothing changed: every digest reused),
a call after one group received a report (that group recomputed, the rest reused), and a call
after every group received one (recomputed for at most the read's budget, stalest first).

    python -m benchmarks.many_clusters [--quick] [--json]
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.standalone import standalone
from benchmarks.timing import median_ms

CLUSTERS = 3000
RANKS = 2
WINDOWS = 3


def _fill(store, clusters: int, start: float) -> list:
    from tests.support.simulate import SimulatedRank
    from capwatch.telemetry.report import RankReport

    groups = []
    futures = []
    for index in range(clusters):
        ranks = [SimulatedRank(f"c{index:05d}", rank, RANKS, cap=1024) for rank in range(RANKS)]
        groups.append(ranks)
        for window in range(WINDOWS):
            begin = start + 60 * window
            for rank in ranks:
                body = rank.report(begin, begin + 59, [200 + index % 300, 400 + window])
                futures.append(store.submit(RankReport.model_validate(body, strict=False), begin + 60))
    for future in futures:
        future.result()
    return groups


def _report_everywhere(store, groups: list, begin: float) -> None:
    from capwatch.telemetry.report import RankReport

    futures = [store.submit(RankReport.model_validate(ranks[1].report(begin, begin + 1, [250]), strict=False), begin + 2)
               for ranks in groups]
    for future in futures:
        future.result()


def run(quick: bool = False) -> dict:
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient

    from capwatch.service.config import Settings
    from capwatch.service.main import create_app, store_options
    from capwatch.service.store.sqlite import Store

    clusters = 300 if quick else CLUSTERS
    repeats = 5 if quick else 15
    now = time.time()
    start = now - 60 * WINDOWS - 30
    with tempfile.TemporaryDirectory(prefix="capwatch-many-") as folder:
        settings = Settings(db_path=Path(folder) / "many.db", maintenance_interval_s=3600.0)
        store = Store(settings.db_path, store_options(settings))
        try:
            load_started = time.perf_counter()
            groups = _fill(store, clusters, start)
            load_s = time.perf_counter() - load_started
            app = create_app(settings, store=store)
            figures: dict = {}
            with TestClient(app, base_url="http://localhost", headers={"Content-Type": "application/json"}) as client:
                for name, path in (("clusters", "/v1/clusters"), ("metrics", "/metrics")):
                    app.state.digests._cache.clear()
                    first = time.perf_counter()
                    response = client.get(path)
                    cold_ms = round((time.perf_counter() - first) * 1e3, 3)
                    assert response.status_code == 200
                    steady_ms = median_ms(lambda: client.get(path), repeats)
                    changed = []
                    for step in range(repeats):
                        rank = groups[step % len(groups)][0]
                        begin = now - 20 + step * 0.001
                        body = json.dumps(rank.report(begin, begin + 1, [300]))
                        assert client.post("/v1/reports", content=body).status_code == 202
                        started = time.perf_counter()
                        client.get(path)
                        changed.append(time.perf_counter() - started)
                    changed.sort()
                    _report_everywhere(store, groups, now - 10 + len(figures))  # every group changed
                    started = time.perf_counter()
                    client.get(path)
                    everything_ms = round((time.perf_counter() - started) * 1e3, 3)
                    figures[name] = {"cold_ms": cold_ms, "steady_median_ms": steady_ms,
                                     "after_one_report_median_ms": round(changed[len(changed) // 2] * 1e3, 3),
                                     "after_every_group_changed_ms": everything_ms,
                                     "bytes": len(response.content)}
        finally:
            store.close()
    return {
        "benchmark": "many_clusters",
        "what": f"GET /v1/clusters and /metrics over {clusters} clusters x {RANKS} ranks, in process",
        "cluster_count": clusters,
        "load_s": round(load_s, 2),
        "goal_ms": 100,
        **figures,
    }


def render(figures: dict) -> None:
    print(f"{figures['what']} (loaded in {figures['load_s']} s); goal <= {figures['goal_ms']} ms")
    print(f"{'endpoint':>10} {'cold ms':>10} {'steady ms':>10} {'after 1 report ms':>18} "
          f"{'all changed ms':>15} {'bytes':>9}")
    for name in ("clusters", "metrics"):
        entry = figures[name]
        print(f"{name:>10} {entry['cold_ms']:>10} {entry['steady_median_ms']:>10} "
              f"{entry['after_one_report_median_ms']:>18} {entry['after_every_group_changed_ms']:>15} {entry['bytes']:>9}")


if __name__ == "__main__":
    standalone("python -m benchmarks.many_clusters", __doc__, run, render)
