"""Ingest rate and latency with durable writes, 1,024 simulated ranks, against real uvicorn processes.

Three servers in the same run, same machine, same client, same report bodies:
  bare     FastAPI endpoint that reads the body and answers 202 (the HTTP stack's ceiling);
  naive    validate + one SQLite transaction (WAL, synchronous=FULL) per request;
  capwatch ``capwatch serve``: strict validation, dedupe, aggregation, group commit (WAL, FULL).
"bare" goes through FastAPI's router; capwatch's accepted reports take an ASGI fast path in front of
it (service/api/routes/reports.py), so capwatch can come close to bare, or pass it, on this figure.
The client is a small asyncio HTTP/1.1 keep-alive client (one connection per group of ranks), so the
client costs far less CPU than the servers it measures.

    python -m benchmarks.ingest [--quick]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from tests.support import launcher
from tests.support.service import ServiceProcess, free_port
from tests.support.simulate import SimulatedRank
from benchmarks.standalone import standalone

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
        self.process = launcher.start(
            "-m", "uvicorn", "--factory", factory, "--host", "127.0.0.1", "--port", str(self.port), "--log-level",
            "warning", "--no-access-log", env=env, imports_tests=True, start_new_session=True)
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

    kill = stop


def run(quick: bool = False) -> dict:
    """Rounds interleave the three servers (rotating who goes first), so the load other jobs put
    on this shared machine hits all three alike; figures are medians over rounds, and the ratios
    are medians of same-round ratios."""
    rounds = 3 if quick else 7
    connections = 64
    start_s = time.time() - 86_400
    results: dict = {"ranks": RANKS, "connections": connections, "rounds": rounds,
                     "reports_per_round_per_server": RANKS, "cpu_cores": os.cpu_count(),
                     "load_average_1m_before": round(os.getloadavg()[0], 2)}
    names = ("bare", "naive", "capwatch")
    batch = 0

    def fresh_bodies() -> list[bytes]:
        nonlocal batch  # new simulated ranks (boot ids) every time: nothing is a duplicate
        batch += 1
        return make_bodies(1, start_s + batch * 600)

    with tempfile.TemporaryDirectory(prefix="capwatch-bench-") as directory:
        servers = {
            "bare": _UvicornApp("benchmarks.ingest_baselines:bare_app", {}),
            "naive": _UvicornApp("benchmarks.ingest_baselines:naive_app",
                                 {"CAPWATCH_BENCH_DB": str(Path(directory) / "naive.db")}),
            "capwatch": ServiceProcess(Path(directory) / "capwatch.db").start(),
        }
        acknowledged = 0
        try:
            for name in names:  # warm-up: imports, first connections, SQLite files
                warm = asyncio.run(_load(servers[name].port, fresh_bodies()[:256], connections, None))
                acknowledged += warm["requests"] if name == "capwatch" else 0
            per_round: dict[str, list[dict]] = {name: [] for name in names}
            for index in range(rounds):
                for name in names[index % 3:] + names[:index % 3]:
                    per_round[name].append(asyncio.run(_load(servers[name].port, fresh_bodies(), connections, None)))
            for name in names:
                rows = per_round[name]
                # The rate 1,024 real ranks produce (one report each per 5 s), open loop.
                paced = asyncio.run(_load(servers[name].port, fresh_bodies(), connections, RANKS / INTERVAL_S))
                results[name] = {
                    "saturated_rate_per_s_median": statistics.median(row["rate_per_s"] for row in rows),
                    "saturated_rates_per_s": [row["rate_per_s"] for row in rows],
                    "saturated_latency_median_ms": statistics.median(row["latency_median_ms"] for row in rows),
                    "saturated_latency_p99_ms": statistics.median(row["latency_p99_ms"] for row in rows),
                    "non_2xx": sum(count for row in rows + [paced] for code, count in row["statuses"].items()
                                   if not code.startswith("2")),
                    "at_1024_ranks_every_5s": {key: paced[key] for key in (
                        "rate_per_s", "latency_median_ms", "latency_p99_ms")},
                }
                if name == "capwatch":
                    acknowledged += sum(row["requests"] for row in rows) + paced["requests"]
            for other in ("bare", "naive"):
                results[f"ratio_capwatch_to_{other}"] = round(statistics.median(
                    mine["rate_per_s"] / theirs["rate_per_s"]
                    for mine, theirs in zip(per_round["capwatch"], per_round[other])), 3)
        finally:
            for name, server in servers.items():
                server.kill()
        import sqlite3
        with sqlite3.connect(Path(directory) / "capwatch.db") as connection:
            stored = connection.execute("SELECT count(*) FROM reports").fetchone()[0]
        results["capwatch"].update(acknowledged_reports=acknowledged, stored_reports=stored)
    results["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    return results


if __name__ == "__main__":
    standalone("python -m benchmarks.ingest", __doc__, run, quick_help="fewer reports per rank")
