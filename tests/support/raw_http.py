"""Hostile HTTP clients on plain sockets (what no HTTP library lets a test do: never finish the headers, never
read the answer, pipeline, repeat a header), and the memory of a process under them."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

from capwatch.demo.ports import LOOPBACK


def request(path: str, method: str = "GET", host: str = LOOPBACK, headers: tuple[tuple[str, str], ...] = (),
            body: bytes = b"", close: bool = False) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *(f"{name}: {value}" for name, value in headers)]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def connect(port: int, receive_buffer: int | None = None, timeout_s: float = 10.0) -> socket.socket:
    """A connection to the service; ``receive_buffer``: a small one makes a client that does not read stall the
    service's answer at once (set before connecting, so the window is small from the start)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(timeout_s)
    sock.connect((LOOPBACK, port))
    return sock


def read_all(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """Everything until the service closes the connection (raises on a timeout: the service kept it open)."""
    sock.settimeout(timeout_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def status_of(answer: bytes) -> int:
    """The status of the first answer in ``answer`` (0: none)."""
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the service closes it."""
    with connect(port, timeout_s=timeout_s) as sock:
        sock.sendall(data)
        return read_all(sock, timeout_s)


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the service has closed ``sock`` (reads what it sent first); False while it is open."""
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def rss_bytes(pid: int) -> int:
    """The resident set of process ``pid`` (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def healthz_ms(port: int, timeout_s: float = 5.0) -> float:
    """How long ``GET /healthz`` took on a fresh connection (raises if it did not answer 200 in time)."""
    started = time.perf_counter()
    answer = exchange(port, request("/healthz", close=True), timeout_s)
    if status_of(answer) != 200:
        raise AssertionError(f"/healthz answered {answer[:200]!r}")
    return (time.perf_counter() - started) * 1000


@dataclass(frozen=True)
class Flood:
    """What ``unread_flood`` saw of the service."""

    rss_before: int
    rss_peak: int
    slowest_healthz_ms: float

    @property
    def rss_growth(self) -> int:
        return self.rss_peak - self.rss_before

    def line(self, what: str) -> str:
        return (f"{what}: RSS {self.rss_before / 2**20:.0f} MiB -> peak {self.rss_peak / 2**20:.0f} MiB "
                f"(+{self.rss_growth / 2**20:.0f} MiB); slowest /healthz {self.slowest_healthz_ms:.0f} ms")


def unread_flood(port: int, pid: int, asked: bytes, clients: int, timeout_s: float) -> Flood:
    """``clients`` connections (a 4 KiB receive window each) that send ``asked`` and never read the answer; waits
    until the service has dropped every one, watching its RSS and ``/healthz`` all along (raises past
    ``timeout_s``), and closes them."""
    from tests.support.waiting import wait_for

    before = rss_bytes(pid)
    peak, slowest, sockets = before, 0.0, []

    def watch() -> None:
        nonlocal peak, slowest
        peak, slowest = max(peak, rss_bytes(pid)), max(slowest, healthz_ms(port))

    try:
        for index in range(clients):
            sock = connect(port, receive_buffer=4096)
            sock.sendall(asked)
            sockets.append(sock)
            if index % 100 == 99:
                watch()

        def all_dropped() -> bool:
            watch()
            return all(closed_by_peer(sock) for sock in sockets)

        wait_for(all_dropped, timeout_s, "the service to drop every client that does not read", poll_s=0.5)
    finally:
        for sock in sockets:
            sock.close()
    return Flood(before, peak, slowest)
