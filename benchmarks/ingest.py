"""Ingest rate and latency with durable writes, 1,024 simulated ranks, against real uvicorn processes.

Three servers in the same run, same machine, same client, same report bodies:
  bare     FastAPI endpoint that reads the body and answers 202 (the HTTP stack's ceiling);
  naive    validate + one SQLite transaction (WAL, synchronous=FULL) per request;
  capwatch ``capwatch serve``: strict validation, dedupe, aggregation, group commit (WAL, FULL).
The client is a small asyncio HTTP/1.1 keep-alive client (one connection per group of ranks), so the
client costs far less CPU than the servers it measures.

    python -m benchmarks.ingest [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from service.launch import REPO_ROOT, ServiceProcess, free_port
from service.simulate import SimulatedRank

RANKS = 1024
INTERVAL_S = 5.0  # a real reporter's default: 1,024 ranks send ~205 reports/s


def make_bodies(reports_per_rank: int, start_s: float) -> list[bytes]:
    ranks = [SimulatedRank(f"bench{rank // 64}", rank % 64, 64, cap=4096) for rank in range(RANKS)]
    bodies = []
    for index in range(reports_per_rank):
        begin = start_s + index * INTERVAL_S
        for rank in ranks:
            peak = 200 + (rank.ep_rank * 31 + index * 17) % 600
            bodies.append(json.dumps(rank.report(begin, begin + INTERVAL_S, [peak // 4, peak // 2, peak])).encode())
    return bodies


def _request(body: bytes) -> bytes:
    return (b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def _connection(port: int, requests: list[bytes], latencies: list[float], statuses: dict,
                      pace_s: float | None, start: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index, request in enumerate(requests):
            if pace_s is not None:  # open loop: each request at its scheduled time
                delay = start + index * pace_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            sent = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - sent)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def _load(port: int, bodies: list[bytes], connections: int, rate_per_s: float | None) -> dict:
    requests = [_request(body) for body in bodies]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    start = time.perf_counter()
    pace = None if rate_per_s is None else connections / rate_per_s
    await asyncio.gather(*(_connection(port, requests[index::connections], latencies, statuses, pace, start)
                           for index in range(connections)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": len(requests), "seconds": round(elapsed, 3), "rate_per_s": round(len(requests) / elapsed, 1),
        "latency_median_ms": round(statistics.median(latencies) * 1e3, 2),
        "latency_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 2),
        "statuses": {str(code): count for code, count in sorted(statuses.items())},
    }


class _UvicornApp:
    """A baseline app factory under uvicorn, configured like ``capwatch serve``."""

    def __init__(self, factory: str, env: dict[str, str]):
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", factory, "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning", "--no-access-log"],
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}, cwd=REPO_ROOT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                import urllib.request
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/docs", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{factory} did not start")

    def stop(self) -> None:
        import signal
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _measure(port: int, bodies: list[bytes], connections: int, realistic_rate: float) -> dict:
    warmup = len(bodies) // 10
    asyncio.run(_load(port, bodies[:warmup], connections, None))
    saturated = asyncio.run(_load(port, bodies[warmup:], connections, None))
    return {"saturated": saturated}


def run(quick: bool = False) -> dict:
    reports_per_rank = 3 if quick else 10
    connections = 64
    start_s = time.time() - 3600
    results: dict = {"ranks": RANKS, "connections": connections, "reports_per_rank": reports_per_rank,
                     "cpu_cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="capwatch-bench-") as directory:
        servers = {
            "bare": lambda: _UvicornApp("benchmarks.ingest_baselines:bare_app", {}),
            "naive": lambda: _UvicornApp("benchmarks.ingest_baselines:naive_app",
                                         {"CAPWATCH_BENCH_DB": str(Path(directory) / "naive.db")}),
            "capwatch": lambda: ServiceProcess(Path(directory) / "capwatch.db").start(),
        }
        for name, start in servers.items():
            bodies = make_bodies(reports_per_rank, start_s)  # fresh boot ids: nothing is a duplicate
            server = start()
            try:
                results[name] = _measure(server.port, bodies, connections, RANKS / INTERVAL_S)
                # the rate 1,024 real ranks produce, open loop: latency when not saturated
                paced = make_bodies(2, start_s + 86_400)
                results[name]["at_1024_ranks_every_5s"] = asyncio.run(
                    _load(server.port, paced, connections, RANKS / INTERVAL_S))
            finally:
                server.kill() if hasattr(server, "kill") else server.stop()
            if name == "capwatch":
                import sqlite3
                with sqlite3.connect(Path(directory) / "capwatch.db") as connection:
                    results[name]["stored_reports"] = connection.execute("SELECT count(*) FROM reports").fetchone()[0]
    bare = results["bare"]["saturated"]["rate_per_s"]
    results["ratio_capwatch_to_bare"] = round(results["capwatch"]["saturated"]["rate_per_s"] / bare, 3)
    results["ratio_capwatch_to_naive"] = round(
        results["capwatch"]["saturated"]["rate_per_s"] / results["naive"]["saturated"]["rate_per_s"], 3)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer reports per rank")
    print(json.dumps(run(parser.parse_args().quick), indent=2))


if __name__ == "__main__":
    main()
