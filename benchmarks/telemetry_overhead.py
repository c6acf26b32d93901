"""Dispatch throughput with the exporter and reporter on vs off, interleaved in one run.

Two gloo rank processes dispatch + combine through ``InstrumentedDispatcher`` at a decode size, in
blocks of steps. Blocks alternate: telemetry off, then on (``RankTelemetry`` started: exporter
serving, reporter posting), swapping which goes first each pair so drift hits both alike. While a
block is "on", the parent scrapes every rank's ``/metrics`` and a local HTTP peer accepts the
reports, both far more often than in production (scrape every 50 ms vs 15 s; report every 50 ms
vs 5 s), so the ratio is an upper bound on the cost.

    python -m benchmarks.telemetry_overhead [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORLD_SIZE = 2
TOKENS = 32
HIDDEN = 256
TOP_K = 8
NUM_EXPERTS = 16
CAP = 256
AGGRESSIVE_INTERVAL_S = 0.05  # both the scrape and the report period while "on"


def _rank(rank: int, world_size: int, service_url: str, blocks: int, steps_per_block: int, ports,
          interval_s: float) -> dict:
    import torch
    from capwatch.dispatcher.counters import DispatchCounters
    from capwatch.dispatcher.instrumented import InstrumentedDispatcher
    from capwatch.dispatcher.torch_backend import TorchA2ABackend
    from capwatch.telemetry.exporter import ExporterOptions
    from capwatch.telemetry.rank import RankTelemetry, rank_config
    from capwatch.telemetry.report import RankIdentity
    from capwatch.telemetry.reporter import ReporterOptions, new_boot_id

    from capwatch.demo.ports import free_port

    backend = TorchA2ABackend(NUM_EXPERTS, TOP_K)
    counters = DispatchCounters(CAP, world_size)
    dispatcher = InstrumentedDispatcher(backend, counters, CAP)
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, NUM_EXPERTS, (TOKENS, TOP_K), generator=generator, dtype=torch.int32)
    payloads = [torch.randn(TOKENS, HIDDEN, generator=generator).to(torch.bfloat16), ids]
    config = rank_config(cap=CAP, ep_size=world_size, hidden_size=HIDDEN, top_k=TOP_K, num_experts=NUM_EXPERTS,
                         backend="torch-gloo")
    port = free_port()  # one port for the whole run, re-bound by every "on" block
    ports.put((rank, port))

    def step() -> None:
        received = dispatcher.dispatch(ids, payloads, TOKENS)
        dispatcher.combine(received[0], TOKENS)

    for _ in range(20):
        step()
    step_seconds: dict[str, list[float]] = {"off": [], "on": []}
    reports = 0
    for block in range(blocks):
        order = ("off", "on") if block % 2 == 0 else ("on", "off")
        for mode in order:
            telemetry = None
            if mode == "on":  # as if the rank restarted: a new boot, sequences from 0
                identity = RankIdentity(cluster="bench", ep_rank=rank, ep_size=world_size, boot_id=new_boot_id())
                telemetry = RankTelemetry(
                    counters, identity, config, exporter=ExporterOptions(base_port=port),
                    reporter=ReporterOptions(service_url, interval_s=interval_s)).start()
            start = time.perf_counter()
            for _ in range(steps_per_block):
                step()
            step_seconds[mode].append((time.perf_counter() - start) / steps_per_block)
            if telemetry is not None:
                telemetry.close()
                reports += telemetry.reporter.stats().delivered
    return {"step_seconds": step_seconds, "reports_delivered": reports}


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (stdlib name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(202)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def run(quick: bool = False, interval_s: float = AGGRESSIVE_INTERVAL_S) -> dict:
    import multiprocessing
    import os

    from capwatch.demo.ranks import spawn_ranks

    blocks, steps_per_block = (6, 100) if quick else (20, 300)
    service = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    ports = multiprocessing.get_context("spawn").Queue()
    scrapes = {"ok": 0}
    done = threading.Event()

    def scraper() -> None:
        urls = []
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not done.is_set():
            while len(urls) < WORLD_SIZE and not done.is_set():
                try:
                    urls.append(f"http://127.0.0.1:{ports.get(timeout=0.5)[1]}/metrics")
                except Exception:  # queue.Empty: ranks still starting
                    pass
            for url in urls:
                try:
                    with opener.open(url, timeout=2) as response:
                        response.read()
                        scrapes["ok"] += 1
                except OSError:
                    pass  # an "off" block: nobody listens
            done.wait(interval_s)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        results = spawn_ranks(WORLD_SIZE, _rank, f"http://127.0.0.1:{service.server_port}", blocks,
                              steps_per_block, ports, interval_s, timeout_s=900)
    finally:
        done.set()
        thread.join(timeout=10)
        service.shutdown()
        service.server_close()
    # A step ends when its slowest rank does: per block, the max over ranks.
    off = [max(rank["step_seconds"]["off"][i] for rank in results) for i in range(blocks)]
    on = [max(rank["step_seconds"]["on"][i] for rank in results) for i in range(blocks)]
    off_median, on_median = statistics.median(off), statistics.median(on)
    return {
        "benchmark": "telemetry_overhead",
        "backend": f"torch.distributed gloo, {WORLD_SIZE} processes, CPU; {TOKENS} tokens, hidden {HIDDEN} bf16",
        "blocks_per_mode": blocks,
        "steps_per_block": steps_per_block,
        "scrape_and_report_interval_s": interval_s,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
        "off_steps_per_s": round(1 / off_median, 1),
        "on_steps_per_s": round(1 / on_median, 1),
        "throughput_ratio_on_vs_off": round(off_median / on_median, 4),
        "paired_throughput_ratio": round(statistics.median(f / n for f, n in zip(off, on)), 4),
        "scrapes_answered": scrapes["ok"],
        "reports_delivered": sum(rank["reports_delivered"] for rank in results),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_overhead",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--interval-s", type=float, default=AGGRESSIVE_INTERVAL_S,
                        help=f"scrape and report period while on (default {AGGRESSIVE_INTERVAL_S})")
    args = parser.parse_args(argv)
    if not args.interval_s > 0:
        parser.error("--interval-s must be > 0")
    figures = run(quick=args.quick, interval_s=args.interval_s)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(figures["backend"])
    print(f"{figures['blocks_per_mode']} interleaved blocks of {figures['steps_per_block']} steps per mode; "
          f"scrape + report every {figures['scrape_and_report_interval_s']} s while on")
    print(f"off: {figures['off_steps_per_s']} steps/s   on: {figures['on_steps_per_s']} steps/s   "
          f"throughput on/off: {figures['throughput_ratio_on_vs_off']} (paired {figures['paired_throughput_ratio']})")
    print(f"scrapes answered: {figures['scrapes_answered']}, reports delivered: {figures['reports_delivered']}; "
          f"load average {figures['load_average_1m_at_end']} on {figures['cpu_count']} CPUs")


if __name__ == "__main__":
    main()
