"""Free loopback ports: the one helper the demo, the tests and the benchmarks use.

A port found free may be taken before it is bound (other programs run at the same time): servers
that can bind port 0 themselves should, and launchers of programs that cannot retry on a lost race.
Within one process no port is handed out twice (the last ``REMEMBERED_PORTS``): a port handed out is
free until its program binds it, so a second caller found it free too — in CI a rank's metrics port
and its group's rendezvous port came out the same, and the rank that bound second failed.

The ports handed out lie outside the kernel's ephemeral range (``ip_local_port_range``), the one it
takes the local port of every outgoing connection from. A port from ``bind(("", 0))`` lies inside it,
and any connection made before the server binds it may take it: in CI a demo rank's exporter found
its port held by a connection (gloo's, an HTTP client's) opened in the seconds between.
"""

from __future__ import annotations

import random
import socket
import threading
from collections import deque
from pathlib import Path

LOOPBACK = "127.0.0.1"
# Below this, ports are often some system service's; above the ephemeral range's end, too few to rely on alone.
LOWEST_PORT = 10_000
LINUX_EPHEMERAL = (32_768, 60_999)  # the default, where /proc cannot be read
_PICK = random.Random()  # its own generator: a test that seeds ``random`` must not make every process pick alike
REMEMBERED_PORTS = 4096
_HANDED_OUT: deque[int] = deque(maxlen=REMEMBERED_PORTS)  # every port of the blocks handed out lately, oldest first
_HANDING_OUT = threading.Lock()


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    try:
        low, high = (int(word) for word in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return LINUX_EPHEMERAL


def candidate_bases(count: int = 1) -> list[int]:
    """Every base port from which ``count`` ports lie outside the ephemeral range, at or above ``LOWEST_PORT``."""
    low, high = ephemeral_range()
    return [base for base in range(LOWEST_PORT, 65_536 - count + 1)
            if base + count - 1 < low or base > high]


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free on ``host`` a moment ago, outside the ephemeral range."""
    return free_port_block(1, host)


def free_port_block(count: int, host: str = LOOPBACK, tries: int = 200) -> int:
    """A base port with ``count`` free ports from it (rank r exports on base + r), outside the ephemeral range."""
    bases = candidate_bases(count)
    with _HANDING_OUT:
        handed_out = set(_HANDED_OUT)
        for _ in range(tries if bases else 0):
            base = _PICK.choice(bases)
            if handed_out.isdisjoint(range(base, base + count)) and block_is_free(base, count, host):
                _HANDED_OUT.extend(range(base, base + count))
                return base
    raise OSError(f"no block of {count} free ports on {host} outside the ephemeral range {ephemeral_range()} "
                  f"in {tries} tries; pass the ports explicitly")


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
