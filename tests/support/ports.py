"""Free loopback ports for test servers: ``free_port`` is the product's one helper
(``capwatch.demo.ports``); ``free_port_pair`` adds the base + 1 a two-rank exporter needs."""

from __future__ import annotations

import socket

from capwatch.demo.ports import LOOPBACK, free_port

__all__ = ["LOOPBACK", "free_port", "free_port_pair"]


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
