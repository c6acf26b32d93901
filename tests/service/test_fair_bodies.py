"""Issue #20, finding 2: 64 connections each declaring a 1,000-byte report, sending "{" and reconnecting when dropped
kept the service's body slots full, and 202 of one honest rank's 206 reports in 60 s got 503. Against a real
`capwatch serve` on loopback, for a bounded time (~15 s): a body that follows its headers within the grace takes no
slot, and one address holds at most its share of the slots.

The reporter's sender (Python's http.client) writes the headers and the body in two sends. When the service needed a
slot as soon as one turn of its loop passed without the body, it was read apart now and then under load and the
honest rank got 503 from the share its own address's slow clients held (a CI failure: 3 of 40)."""

from __future__ import annotations

import json
import socket
import threading
import time

from capwatch.telemetry.report import RankReport
from capwatch.telemetry.reporter import HttpReportSender, ReporterOptions

from tests.support.raw_http import read_all, status_of
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank

SLOW_CLIENTS = 64
SLOW_BODY = b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"


class SlowClients:
    """``count`` clients from ``source`` that declare a body, send one byte of it, and reconnect when answered."""

    def __init__(self, port: int, count: int, source: str = "127.0.0.1"):
        self.port, self.source = port, source
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=30,
                                              source_address=(self.source, 0)) as sock:
                    sock.sendall(SLOW_BODY)
                    self.statuses.append(status_of(read_all(sock, timeout_s=30)))
            except OSError:
                pass
            # Reconnect, at a pace the machine's ephemeral ports last (each closed connection holds one in
            # TIME_WAIT for a minute): without it, refused clients reconnecting at once ran this host out of them.
            time.sleep(0.05)

    def __enter__(self) -> SlowClients:
        for thread in self.threads:
            thread.start()
        time.sleep(1.0)  # they hold what they can
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=40)


def honest_reports(url: str, cluster: str, count: int) -> list[str]:
    """Sent the way a rank sends them: the reporter's own HTTP sender."""
    rank = SimulatedRank(cluster, 0, 1, cap=1024)
    send = HttpReportSender(ReporterOptions(url, request_timeout_s=30.0))
    details = []
    for _ in range(count):
        now = time.time()
        details.append(send(RankReport.model_validate(rank.report(now - 1, now, [100]), strict=False)).detail)
        time.sleep(0.1)
    return details


def test_an_honest_ranks_reports_are_accepted_while_64_slow_clients_try(tmp_path):
    with ServiceProcess(tmp_path / "fair.db", env={"CAPWATCH_BODY_TIMEOUT_S": "3"}) as service:
        with SlowClients(service.port, SLOW_CLIENTS) as slow:
            answers = honest_reports(service.url, "honest", 40)
        assert answers == ["HTTP 202"] * 40
        assert 408 in slow.statuses and 503 in slow.statuses  # they were there, held and refused


def post_in_two_sends(port: int, body: bytes, pause_s: float, source: str = "127.0.0.1") -> int:
    """The headers and the first 10 bytes, then the rest ``pause_s`` later: the status answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as sock:
        sock.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(pause_s)
        sock.sendall(body[10:])
        return status_of(read_all(sock))


def test_a_body_that_follows_its_headers_within_the_grace_needs_no_slot_even_when_its_address_has_none_left(tmp_path):
    """The race above made certain: the body comes 0.1 s after its headers (within the 0.5 s grace), from the address
    whose whole share the slow clients hold. Needing a slot at once, every one of these got 503."""
    with ServiceProcess(tmp_path / "apart.db", env={"CAPWATCH_BODY_TIMEOUT_S": "3"}) as service:
        with SlowClients(service.port, SLOW_CLIENTS) as slow:
            rank = SimulatedRank("apart", 0, 1, cap=1024)
            statuses = []
            for _ in range(5):
                now = time.time()
                statuses.append(post_in_two_sends(service.port, json.dumps(rank.report(now - 1, now, [100])).encode(),
                                                  pause_s=0.1))
        assert statuses == [202] * 5
        assert 503 in slow.statuses  # the address's share was held throughout


def test_one_address_holds_at_most_its_share_and_a_body_that_trickles_in_from_another_gets_a_slot(tmp_path):
    """A rank whose report arrives in two pieces further apart than the grace needs a slot: 64 slow clients from one
    address hold at most CAPWATCH_MAX_BODIES_PER_CLIENT of them, and the rank, from another address, gets one."""
    env = {"CAPWATCH_BODY_TIMEOUT_S": "5", "CAPWATCH_BODY_GRACE_S": "0.1", "CAPWATCH_MAX_CONCURRENT_BODIES": "16",
           "CAPWATCH_MAX_BODIES_PER_CLIENT": "4"}
    with ServiceProcess(tmp_path / "share.db", env=env) as service:
        with SlowClients(service.port, SLOW_CLIENTS, source="127.0.0.2") as slow:
            rank = SimulatedRank("split", 0, 1, cap=1024)
            accepted = []
            for _ in range(5):
                now = time.time()
                body = json.dumps(rank.report(now - 1, now, [100])).encode()
                # the rest comes past the grace: this body waits, in a slot
                accepted.append(post_in_two_sends(service.port, body, pause_s=0.3, source="127.0.0.3"))
        assert accepted == [202] * 5
        held = [status for status in slow.statuses if status == 408]
        assert held and slow.statuses.count(503) > len(held)  # most were refused their share at once


def post_paced(port: int, body: bytes, segment: int = 16 << 10, pause_s: float = 0.005,
               source: str = "127.0.0.1") -> int:
    """A body as a network delivers it: ``segment`` bytes every ``pause_s``; the status answered (0: cut off)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as sock:
        sock.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        try:
            for start in range(0, len(body), segment):
                time.sleep(pause_s)
                sock.sendall(body[start:start + segment])
        except OSError:
            return 0  # the service answered and closed while the rank still sent (broken pipe)
        return status_of(read_all(sock))


def test_a_large_paced_report_is_not_starved_by_slow_bodies_from_eight_addresses(tmp_path):
    """Issue #36, finding 5 (F22): 8 addresses each re-opening 8 slow bodies filled the 64 body slots, and a rank's
    96.5 KB report sent as a network delivers it (16 KiB segments 5 ms apart) was refused 58 of 60 times. A body
    arriving at a network's pace now takes the slot of one that trickles (which gets 408)."""
    with ServiceProcess(tmp_path / "paced.db", env={"CAPWATCH_BODY_TIMEOUT_S": "5"}) as service:
        slow = [SlowClients(service.port, 16, source=f"127.0.0.{2 + index}") for index in range(8)]  # past each share
        for clients in slow:
            clients.__enter__()
        try:
            rank = SimulatedRank("paced", 0, 1, cap=16384)
            statuses = []
            for _ in range(10):
                now = time.time()
                body = json.dumps(rank.report(now - 5, now, list(range(1, 8801)))).encode()
                assert len(body) > 96_000
                statuses.append(post_paced(service.port, body))
        finally:
            for clients in slow:
                clients.stop.set()
            for clients in slow:
                clients.__exit__(None, None, None)
        assert statuses == [202] * 10, statuses
        assert any(408 in clients.statuses for clients in slow)  # the slow ones were there, and cut off
