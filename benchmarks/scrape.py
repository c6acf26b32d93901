"""Scrape time of one rank's ``/metrics``: a live exporter over HTTP, and the render alone.

The counters hold a busy history (every R bin from 1 to past the cap filled), so the
per-scrape work (one host copy of the counters, cumulative buckets over cap + 2 bins, text
exposition) is what a production rank pays. Medians over many scrapes, per cap.

    python -m benchmarks.scrape [--quick] [--json]
"""

from __future__ import annotations

import urllib.request

from benchmarks.timing import median_ms
from benchmarks.standalone import standalone

CAPS = (1024, 4096, 16384)
EP_SIZE = 8


def _busy_telemetry(cap: int):
    import torch

    from capwatch.dispatcher.counters import DispatchCounters
    from capwatch.telemetry.exporter import ExporterOptions
    from capwatch.telemetry.rank import RankTelemetry, rank_config
    from capwatch.telemetry.report import RankIdentity
    from capwatch.telemetry.reporter import new_boot_id

    counters = DispatchCounters(cap, EP_SIZE)
    send = torch.arange(EP_SIZE, dtype=torch.int64)
    for runtime_tokens in range(1, cap + 3, max(1, cap // 512)):
        counters.record_step(runtime_tokens)
        counters.record_dispatch(send, send)
    counters.record_overflow("runtime_over_cap", "raised")
    identity = RankIdentity(cluster="bench", ep_rank=0, ep_size=EP_SIZE, boot_id=new_boot_id())
    config = rank_config(cap=cap, ep_size=EP_SIZE, hidden_size=7168, top_k=8, num_experts=256, backend="torch")
    telemetry = RankTelemetry(counters, identity, config, exporter=ExporterOptions(base_port=0)).start()
    telemetry.tracker.close()
    return telemetry


def run(quick: bool = False) -> dict:
    iterations = 30 if quick else 300
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    per_cap = {}
    for cap in CAPS:
        telemetry = _busy_telemetry(cap)
        try:
            url = telemetry.metrics_url

            def scrape() -> None:
                with opener.open(url, timeout=10) as response:
                    response.read()

            scrape()  # warm-up
            per_cap[str(cap)] = {
                "http_scrape_median_ms": median_ms(scrape, iterations),
                "render_median_ms": median_ms(telemetry.exporter.render, iterations),
                "snapshot_median_ms": median_ms(telemetry.tracker.snapshot, iterations),
                "exposition_bytes": len(telemetry.exporter.render()),
            }
        finally:
            telemetry.close()
    return {
        "benchmark": "scrape",
        "what": "one rank's /metrics over HTTP on loopback (new connection each), CPU counters",
        "ep_size": EP_SIZE,
        "iterations": iterations,
        "per_cap": per_cap,
    }


def render(figures: dict) -> None:
    print(f"{figures['what']}; {figures['iterations']} scrapes per cap (medians)")
    print(f"{'cap':>7} {'HTTP ms':>9} {'render ms':>10} {'snapshot ms':>12} {'bytes':>7}")
    for cap, entry in figures["per_cap"].items():
        print(f"{cap:>7} {entry['http_scrape_median_ms']:>9} {entry['render_median_ms']:>10} "
              f"{entry['snapshot_median_ms']:>12} {entry['exposition_bytes']:>7}")


if __name__ == "__main__":
    standalone("python -m benchmarks.scrape", __doc__, run, render)
