"""The one helper that picks loopback ports (demo, tests, benchmarks) hands out ports the kernel will not give an
outgoing connection meanwhile: outside its ephemeral range. A port from bind(0) lay inside it, and a demo rank's
exporter once found its port taken by a connection opened between the pick and the bind (CI: EADDRINUSE)."""

from __future__ import annotations

from collections import deque

import pytest
from capwatch.demo import ports


def test_free_ports_and_blocks_lie_outside_the_ephemeral_range_and_are_free():
    low, high = ports.ephemeral_range()
    assert ports.LOWEST_PORT <= low <= high <= 65_535
    for _ in range(50):
        port = ports.free_port()
        assert not low <= port <= high and port >= ports.LOWEST_PORT
        base = ports.free_port_block(4)
        assert all(not low <= base + offset <= high for offset in range(4))
        assert ports.block_is_free(base, 4)


def test_the_range_is_read_from_the_kernel_and_defaults_to_linuxs(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ports.ephemeral_range(path) == (40000, 50000)
    assert ports.ephemeral_range(tmp_path / "absent") == ports.LINUX_EPHEMERAL
    path.write_text("garbage")
    assert ports.ephemeral_range(path) == ports.LINUX_EPHEMERAL



def test_no_port_is_handed_out_twice_in_a_process_while_its_program_has_not_bound_it(monkeypatch):
    """A port handed out stays free until its program binds it, so a second caller would find it free too: in CI a
    rank's metrics port (a two-rank block) and its group's rendezvous port came out the same. Among a few free
    candidates the helper hands out each block once, every port of it remembered, then says it found none."""
    monkeypatch.setattr(ports, "_HANDED_OUT", deque(maxlen=ports.REMEMBERED_PORTS))
    chosen = [base for base in ports.candidate_bases(2) if base % 10 == 0 and ports.block_is_free(base, 2)][:3]
    monkeypatch.setattr(ports, "candidate_bases", lambda count=1: list(chosen))
    assert sorted(ports.free_port_block(2, tries=500) for _ in chosen) == chosen  # each block once
    assert all(ports.block_is_free(base, 2) for base in chosen)  # still free: remembered, not bound
    with pytest.raises(OSError, match="no block of 2 free ports"):
        ports.free_port_block(2, tries=50)
    monkeypatch.setattr(ports, "candidate_bases", lambda count=1: [base + 1 for base in chosen])
    with pytest.raises(OSError, match="no block of 1 free ports"):  # the second port of each block too
        ports.free_port_block(1, tries=50)
