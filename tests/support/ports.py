"""Free loopback ports for test servers. Other suites run on this machine at the same time, so a
port found free may be taken before it is bound: servers that can bind port 0 themselves should,
and launchers of programs that cannot (Prometheus) retry on a lost race."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def free_port_pair(attempts: int = 50) -> int:
    """A base port whose base + 1 was also free a moment ago (for base port + local rank)."""
    for _ in range(attempts):
        base = free_port()
        if base >= 65535:
            continue
        with socket.socket() as other:
            try:
                other.bind((LOOPBACK, base + 1))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no two adjacent free ports on {LOOPBACK} in {attempts} attempts")
