"""Slow clients cannot starve the service: a real uvicorn on loopback, clients that declare a large
body and trickle it. Bodies beyond ``max_concurrent_bodies`` are refused at once (503), the others
are cut off at ``body_timeout_s`` (408), and ``/healthz`` answers throughout. Bounded: a dozen
connections and a one-second deadline."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from capwatch.service.config import Settings
from tests.support.service import free_port
from capwatch.service.main import create_app

HELD = 4
CLIENTS = 12


def _status(connection: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def test_trickled_bodies_are_bounded_in_number_and_time(tmp_path):
    port = free_port()
    settings = Settings(db_path=tmp_path / "slow.db", port=port, body_timeout_s=1.0, max_concurrent_bodies=HELD,
                        max_bodies_per_client=HELD)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    clients = []
    try:
        started = time.monotonic()
        for _ in range(CLIENTS):
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)
            connection.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 4000000\r\n\r\n{")  # and never the rest
            clients.append(connection)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as health:
            health.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert _status(health) == 200  # answered while the slow bodies are held
        statuses = sorted(_status(connection) for connection in clients)
        elapsed = time.monotonic() - started
        assert statuses == [408] * HELD + [503] * (CLIENTS - HELD), statuses
        assert elapsed < 5, elapsed  # the held ones were cut off at the deadline, not left to the client
        for connection in clients:  # and closed by the service (a timeout here would raise)
            connection.settimeout(5)
            while connection.recv(65536):
                pass
    finally:
        for connection in clients:
            connection.close()
        server.should_exit = True
        thread.join(timeout=10)
