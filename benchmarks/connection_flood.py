"""Clients that do not read their answers, or never finish their headers, against ``capwatch serve`` (its bounded
HTTP protocol, ``service/http_server.py``) and, as the control, the same app on plain uvicorn (what the service
ran before), side by side on loopback, in alternating rounds on fresh servers.

- unread answers: clients each pipeline requests for the list of 600 clusters (~200 KB each) with a 4 KiB receive
  window and never read; for 8 s: the service's peak RSS growth, the kernel's TCP buffer memory growth
  (``/proc/net/sockstat``), ``/healthz`` latency (median, max) and how many of the clients it still holds at
  the end;
- unread histories: clients each ask for the history of a group of 8 ranks x 2,500 intervals (20,000, ~3.5 MB of
  JSON; the issue's `since_s=1&limit=100000`) and never read it: the same figures;
- unfinished headers: connections that send half a request line and stop: how many are still held after 5 s;
- idle: ``/healthz`` latency with nothing else going on (the floor).

capwatch serve runs with CAPWATCH_SEND_TIMEOUT_S=2 and CAPWATCH_HEADER_TIMEOUT_S=2 (defaults 10 s) so that the
drops fall inside the window.

    python -m benchmarks.connection_flood [--quick] [--json]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.standalone import standalone

CLUSTERS = 600
PIPELINED = 8
HISTORY_RANKS, HISTORY_INTERVALS = 8, 2500
WINDOW_S = 8.0
LIMITS = {"CAPWATCH_SEND_TIMEOUT_S": "2", "CAPWATCH_HEADER_TIMEOUT_S": "2"}


def _tcp_memory_bytes() -> int:
    """The kernel's TCP buffer memory in this network namespace (pages in /proc/net/sockstat)."""
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


class _PlainUvicorn:
    """The control: the same app (capwatch.service.main:create_app) on uvicorn's own protocol."""

    def __init__(self, db_path: Path):
        import subprocess

        from tests.support.launcher import start
        from tests.support.service import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = start(
            "-m", "uvicorn", "--factory", "capwatch.service.main:create_app", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", "critical", "--no-access-log",
            env={"CAPWATCH_DB_PATH": str(db_path)}, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> _PlainUvicorn:
        from tests.support.waiting import wait_for

        wait_for(lambda: self._answers(), 60, "plain uvicorn to answer", poll_s=0.1)
        return self

    def _answers(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        import signal

        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _filled_database(folder: Path) -> Path:
    """Every server starts from a copy of one database: the 600 clusters and the deep group's history."""
    from capwatch.service.store.options import StoreOptions
    from capwatch.service.store.sqlite import Store
    from capwatch.telemetry.report import RankReport
    from tests.support.simulate import SimulatedRank

    path = folder / "filled.db"
    now = time.time()
    start = now - HISTORY_INTERVALS * 5 - 60
    store = Store(path, StoreOptions(maintenance_interval_s=3600.0))
    try:
        futures = []
        for index in range(CLUSTERS):
            rank = SimulatedRank(f"flood-{index:04d}", 0, 1, cap=1024)
            futures.append(store.submit(RankReport.model_validate(rank.report(now - 30, now - 20, [100]),
                                                                  strict=False), now))
        ranks = [SimulatedRank("deep", rank, HISTORY_RANKS, cap=1024) for rank in range(HISTORY_RANKS)]
        for step in range(HISTORY_INTERVALS):
            for rank in ranks:
                body = rank.report(start + 5 * step, start + 5 * step + 5, [100 + step % 400])
                futures.append(store.submit(RankReport.model_validate(body, strict=False), now))
        for future in futures:
            future.result()
    finally:
        store.close()
    return path


def _server(kind: str, folder: Path, round_index: int, filled: Path):
    import shutil

    from tests.support.service import ServiceProcess

    db_path = folder / f"{kind}-{round_index}.db"
    shutil.copy(filled, db_path)
    if kind == "capwatch":
        return ServiceProcess(db_path, env=LIMITS).start(timeout_s=60)
    return _PlainUvicorn(db_path).start()


def _ready(url: str) -> None:
    import httpx

    from tests.support.waiting import wait_for

    with httpx.Client(base_url=url, timeout=30) as client:
        wait_for(lambda: client.get("/v1/clusters").content.count(b'"pending":false') == CLUSTERS + 1, 60, "digests")


def _observe(server, sockets: list, window_s: float) -> dict:
    from tests.support.raw_http import closed_by_peer, healthz_ms, rss_bytes

    pid = server.process.pid
    rss_before, tcp_before = rss_bytes(pid), _tcp_memory_bytes()
    peak_rss, peak_tcp, healthz, failures = rss_before, tcp_before, [], 0
    started = time.perf_counter()
    while time.perf_counter() - started < window_s:
        peak_rss, peak_tcp = max(peak_rss, rss_bytes(pid)), max(peak_tcp, _tcp_memory_bytes())
        try:
            healthz.append(healthz_ms(server.port, timeout_s=5))
        except (OSError, AssertionError):
            failures += 1
        time.sleep(0.5)
    held = sum(not closed_by_peer(sock) for sock in sockets)
    return {"rss_growth_mib": round((peak_rss - rss_before) / 2**20, 1),
            "tcp_memory_growth_mib": round((peak_tcp - tcp_before) / 2**20, 1),
            "healthz_median_ms": round(statistics.median(healthz), 1) if healthz else None,
            "healthz_max_ms": round(max(healthz), 1) if healthz else None, "healthz_failures": failures,
            "clients_still_held": held, "clients": len(sockets)}


def _unread_answers(server, clients: int, asked: bytes) -> dict:
    from tests.support.raw_http import connect

    sockets = []
    try:
        for _ in range(clients):
            sock = connect(server.port, receive_buffer=4096)
            sock.sendall(asked)
            sockets.append(sock)
        return _observe(server, sockets, WINDOW_S)
    finally:
        for sock in sockets:
            sock.close()


def _unfinished_headers(server, clients: int) -> int:
    from tests.support.raw_http import closed_by_peer, connect

    sockets = []
    try:
        for _ in range(clients):
            sock = connect(server.port)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            sockets.append(sock)
        time.sleep(5.0)
        return sum(not closed_by_peer(sock) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def run(quick: bool = False) -> dict:
    from tests.support.raw_http import healthz_ms, request

    clients = 100 if quick else 500
    history_clients = 50 if quick else 100
    rounds = 1 if quick else 2
    kinds = ("capwatch", "plain_uvicorn")
    per_kind: dict[str, list[dict]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="capwatch-flood-") as directory:
        filled = _filled_database(Path(directory))
        for round_index in range(rounds):
            for kind in kinds[round_index % 2:] + kinds[:round_index % 2]:
                server = _server(kind, Path(directory), round_index, filled)
                try:
                    _ready(server.url)
                    idle = statistics.median(healthz_ms(server.port) for _ in range(10))
                    lists = _unread_answers(server, clients, request("/v1/clusters") * PIPELINED)
                    time.sleep(1.0)
                    histories = _unread_answers(server, history_clients,
                                                request("/v1/clusters/deep/history?since_s=1&limit=100000"))
                    time.sleep(1.0)
                    held = _unfinished_headers(server, clients)
                    per_kind[kind].append({"idle_healthz_median_ms": round(idle, 1),
                                           **{f"lists_{key}": value for key, value in lists.items()},
                                           **{f"histories_{key}": value for key, value in histories.items()},
                                           "unfinished_headers_still_held": held})
                finally:
                    server.stop()
    figures: dict = {"clients": clients, "history_clients": history_clients, "pipelined_per_client": PIPELINED,
                     "history_intervals": HISTORY_RANKS * HISTORY_INTERVALS, "rounds": rounds, "window_s": WINDOW_S,
                     "load_average_1m": round(os.getloadavg()[0], 2)}
    for kind, rows in per_kind.items():
        figures[kind] = {key: (statistics.median(row[key] for row in rows) if rows[0][key] is not None else None)
                         for key in rows[0]}
    return figures


def render(figures: dict) -> None:
    print(f"lists: {figures['clients']} clients x {figures['pipelined_per_client']} unread answers; histories: "
          f"{figures['history_clients']} clients x 1 unread history of {figures['history_intervals']} intervals; "
          f"medians of {figures['rounds']} round(s); load {figures['load_average_1m']}")
    for kind in ("capwatch", "plain_uvicorn"):
        row = figures[kind]
        print(f"{kind}: idle /healthz {row['idle_healthz_median_ms']} ms; unfinished headers still held "
              f"{row['unfinished_headers_still_held']}")
        for scenario in ("lists", "histories"):
            print(f"  {scenario:>9}: RSS +{row[f'{scenario}_rss_growth_mib']} MiB, kernel TCP "
                  f"+{row[f'{scenario}_tcp_memory_growth_mib']} MiB, /healthz median "
                  f"{row[f'{scenario}_healthz_median_ms']} ms (max {row[f'{scenario}_healthz_max_ms']}), "
                  f"still held {row[f'{scenario}_clients_still_held']} of {row[f'{scenario}_clients']}")


if __name__ == "__main__":
    standalone("python -m benchmarks.connection_flood", __doc__, run, render)
