"""Free loopback ports: the one helper the demo, the tests and the benchmarks use.

A port found free may be taken before it is bound (other programs run at the same time): servers
that can bind port 0 themselves should, and launchers of programs that cannot retry on a lost race.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def free_port_block(count: int, host: str = LOOPBACK, tries: int = 50) -> int:
    """A base port with ``count`` free ports from it (rank r exports on base + r), anywhere the OS offers."""
    for _ in range(tries):
        base = free_port(host)
        if block_is_free(base, count, host):
            return base
    raise OSError(f"no block of {count} free ports on {host} in {tries} tries")


def block_is_free(base: int, count: int, host: str = LOOPBACK) -> bool:
    """Ports ``base`` .. ``base + count - 1`` all exist and are free on ``host``."""
    return base + count - 1 <= 65_535 and all(port_is_free(base + offset, host) for offset in range(count))


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As uvicorn binds: a port whose old connections linger in TIME_WAIT is free to reuse.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
