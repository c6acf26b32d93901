"""Advice latency with 7 days of history for 1,024 ranks (16 EP groups of 64).

The history is built the way the service builds it: the last ``recent`` hours as real rank
reports through the store's ingest path (one per rank per minute), everything older as the
per-window group samples those reports turn into (the max over the group's 64 ranks), folded by
the store's own maintenance into one decaying histogram per group. Then the advice is timed in
process and over HTTP against a real ``capwatch serve`` on the same database. In process, side by
side: the whole chain computed fresh (what a group whose data changed costs) and the group's digest
reused (what ``GET /advice`` serves while the data is unchanged); over HTTP, the digest.

    python -m benchmarks.advice_latency [--quick]
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import httpx

from capwatch.service.config import Settings
from capwatch.service.digests import GroupDigests
from capwatch.service.main import store_options
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank
from capwatch.service.store.sqlite import Store
from capwatch.service.queries import cluster_advice
from capwatch.telemetry.report import RankReport
from benchmarks.timing import median_ms
from benchmarks.standalone import standalone

GROUPS = 16
EP_SIZE = 64
DAYS = 7
WINDOW_S = 60.0


def _peak(rng: random.Random, hot: bool) -> int:
    # mostly quiet decode steps, a diurnal-ish swell, rare bursts; one hot rank per group
    peak = int(rng.lognormvariate(5.3, 0.35)) + (300 if hot else 0)
    return peak * 3 if rng.random() < 0.0005 else peak


def build(directory: Path, recent_s: float, now: float) -> tuple[Settings, dict]:
    settings = Settings(db_path=directory / "history.db", fold_after_s=recent_s)
    store = Store(settings.db_path, store_options(settings), clock=lambda: now)
    rng = random.Random(7)
    started = time.perf_counter()
    old_windows = int((DAYS * 86_400 - recent_s) // WINDOW_S)
    first = now - DAYS * 86_400
    rows = []
    for group in range(GROUPS):
        for window in range(old_windows):
            peak = max(_peak(rng, rank == 5) for rank in range(EP_SIZE))
            rows.append((f"group{group}", "target", first + window * WINDOW_S, peak, 4096, 0, EP_SIZE))
    store.run_in_writer(lambda connection: (
        connection.execute("BEGIN"),
        connection.executemany("INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, ?)", rows),
        connection.execute("COMMIT"))).result()
    folded_s = time.perf_counter() - started
    ranks = [SimulatedRank(f"group{group}", rank, EP_SIZE, cap=4096) for group in range(GROUPS)
             for rank in range(EP_SIZE)]
    recent_windows = int(recent_s // WINDOW_S)
    started = time.perf_counter()
    pending = []
    for window in range(recent_windows):
        begin = now - recent_s + window * WINDOW_S
        for rank in ranks:
            peak = _peak(rng, rank.ep_rank == 5)
            body = json.dumps(rank.report(begin, begin + WINDOW_S - 1, [peak // 2, peak])).encode()
            pending.append(store.submit(RankReport.model_validate_json(body), begin + WINDOW_S, body))
        if len(pending) > 20_000:
            [future.result() for future in pending]
            pending.clear()
    [future.result() for future in pending]
    ingest_s = time.perf_counter() - started
    store.maintain()  # folds the old windows, as the running service does every few seconds
    counts = store.run_in_writer(lambda connection: {
        table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("reports", "windows", "folded", "ranks")}).result()
    histogram = store.sample_history("group0", "target")
    store.close()
    return settings, {
        "old_group_samples_folded": old_windows * GROUPS, "recent_reports": recent_windows * len(ranks),
        "build_old_s": round(folded_s, 1), "build_recent_s": round(ingest_s, 1),
        "recent_ingest_rate_per_s_in_process": round(recent_windows * len(ranks) / ingest_s, 1),
        "rows": counts, "histogram_buckets_per_group": len(histogram.usage.weights),
        "samples_per_group": histogram.sample_count,
        "db_bytes": sum(path.stat().st_size for path in directory.glob("history.db*")),
    }


def run(quick: bool = False) -> dict:
    recent_s = 1800.0 if quick else 6 * 3600.0
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="capwatch-advice-") as directory:
        settings, figures = build(Path(directory), recent_s, now)
        store = Store(settings.db_path, store_options(settings))
        try:
            advice = cluster_advice(store, "group0", "target", time.time(), settings)
            figures["in_process_advice_median_ms"] = median_ms(
                lambda: cluster_advice(store, "group3", "target", time.time(), settings), 30)
            figures["in_process_all_groups_median_ms"] = median_ms(
                lambda: [cluster_advice(store, f"group{g}", "target", time.time(), settings) for g in range(GROUPS)], 5)
            digests = GroupDigests(store, settings, time.time)
            digests.group("group3", "target", time.time())
            figures["in_process_advice_from_digest_median_ms"] = median_ms(
                lambda: digests.group("group3", "target", time.time()), 30)
        finally:
            store.close()
        with ServiceProcess(settings.db_path) as server, httpx.Client(base_url=server.url, timeout=60) as client:
            client.get("/v1/clusters/group0/advice").raise_for_status()
            figures["http_advice_median_ms"] = median_ms(
                lambda: client.get("/v1/clusters/group3/advice").raise_for_status(), 30)
            figures["http_cluster_view_median_ms"] = median_ms(
                lambda: client.get("/v1/clusters/group3").raise_for_status(), 30)
            figures["http_all_clusters_median_ms"] = median_ms(
                lambda: client.get("/v1/clusters").raise_for_status(), 5)
    figures.update(days=DAYS, ranks=GROUPS * EP_SIZE, groups=GROUPS, recent_raw_hours=recent_s / 3600,
                   example_advice={key: getattr(advice, key) for key in (
                       "action", "current_cap", "recommended_cap", "lower_bound", "upper_bound", "confidence",
                       "sample_count", "max_peak_runtime_tokens")})
    return figures


if __name__ == "__main__":
    standalone("python -m benchmarks.advice_latency", __doc__, run, quick_help="30 min of raw reports instead of 6 h")
