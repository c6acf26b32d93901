"""The one helper that picks loopback ports (demo, tests, benchmarks) hands out ports the kernel will not give an
outgoing connection meanwhile: outside its ephemeral range. A port from bind(0) lay inside it, and a demo rank's
exporter once found its port taken by a connection opened between the pick and the bind (CI: EADDRINUSE)."""

from __future__ import annotations

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
