"""Free loopback ports for test servers: ``free_port`` is the product's one helper
(``capwatch.demo.ports``, with ``free_port_block`` for ranks exporting on base + rank); ``free_port_pair`` is the
block a two-rank exporter needs."""

from __future__ import annotations

from capwatch.demo.ports import LOOPBACK, free_port, free_port_block

__all__ = ["LOOPBACK", "free_port", "free_port_block", "free_port_pair"]


def free_port_pair() -> int:
    """A base port whose base + 1 was also free a moment ago (for base port + local rank), both handed out to no
    other caller of this process."""
    return free_port_block(2)
