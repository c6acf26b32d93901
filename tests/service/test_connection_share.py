"""Issue #36, finding 2 (F18): one client opening every connection slot (CAPWATCH_MAX_CONNECTIONS) and re-opening
each one the service drops (12,334 opens in 60 s) got a rank's posts 173 of 176 -> 503 and /healthz 176 of 176 ->
503. Against a real ``capwatch serve`` on loopback, bounded in count (256 slots) and time (~10 s a test): when the
connections are all taken a newcomer takes the place of an idle or slow one, of its own address when that holds its
share, else of the address holding the most; only when every connection is busy with a request is one refused."""

from __future__ import annotations

import selectors
import socket
import threading
import time

import httpx

from capwatch.telemetry.report import RankReport
from capwatch.telemetry.reporter import HttpReportSender, ReporterOptions

from tests.support.raw_http import connect, read_all, status_of
from tests.support.service import ServiceProcess
from tests.support.simulate import SimulatedRank

SLOTS = 256
FLOOD_S = 8.0


class ReopeningFlood:
    """``count`` idle connections from ``source`` (never a byte sent), each re-opened as soon as the service closes
    it, from one thread, until stopped: the issue's reproduction, at a bounded size."""

    def __init__(self, port: int, count: int, source: str = "127.0.0.1"):
        self.port, self.count, self.source = port, count, source
        self.opens = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, selector: selectors.BaseSelector) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((self.source, 0))
        sock.connect_ex(("127.0.0.1", self.port))
        selector.register(sock, selectors.EVENT_READ)
        self.opens += 1

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.count):
                self._open(selector)
            while not self.stop.is_set():
                for key, _ in selector.select(0.05):
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
                    self._open(selector)
            for key in list(selector.get_map().values()):
                key.fileobj.close()

    def __enter__(self) -> ReopeningFlood:
        self.thread.start()
        time.sleep(1.0)  # every slot taken
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def honest_traffic(service, cluster: str, seconds: float, source: str = "127.0.0.1") -> tuple[list[str], list[int]]:
    """A rank's reports (its own sender, a new connection each) and /healthz, alternately, for ``seconds``."""
    rank = SimulatedRank(cluster, 0, 1, cap=1024)
    send = HttpReportSender(ReporterOptions(service.url, request_timeout_s=10.0))
    reports, probes = [], []
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=service.url, timeout=10, transport=transport,
                      limits=httpx.Limits(max_keepalive_connections=0)) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            now = time.time()
            reports.append(send(RankReport.model_validate(rank.report(now - 1, now, [100]), strict=False)).detail)
            try:
                probes.append(client.get("/healthz").status_code)
            except httpx.HTTPError as error:
                probes.append(type(error).__name__)
            time.sleep(0.1)
    return reports, probes


def test_a_client_reopening_every_slot_locks_neither_a_rank_nor_healthz_out(tmp_path):
    """The issue's flood from the rank's own address: the flood's idle connections give their places."""
    with ServiceProcess(tmp_path / "share.db", env={"CAPWATCH_MAX_CONNECTIONS": str(SLOTS)}) as service:
        with ReopeningFlood(service.port, SLOTS) as flood:
            reports, probes = honest_traffic(service, "honest", FLOOD_S)
        assert flood.opens > 2 * SLOTS  # it was there, re-opening what the service closed
        assert reports == ["HTTP 202"] * len(reports) and len(reports) >= 10, reports
        assert probes == [200] * len(probes), probes


def test_a_flood_from_another_address_gives_its_places_first(tmp_path):
    """The flood from 127.0.0.2, the rank from 127.0.0.1 holding a keep-alive connection: the newcomer's place comes
    from the address holding the most, so the rank's idle connection is kept."""
    with ServiceProcess(tmp_path / "other.db", env={"CAPWATCH_MAX_CONNECTIONS": str(SLOTS)}) as service:
        kept = connect(service.port)
        try:
            with ReopeningFlood(service.port, SLOTS, source="127.0.0.2"):
                reports, probes = honest_traffic(service, "other", FLOOD_S / 2, source="127.0.0.3")
                kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                assert status_of(read_all(kept)) == 200  # its idle connection was never taken from it
        finally:
            kept.close()
        assert reports == ["HTTP 202"] * len(reports) and probes == [200] * len(probes), (reports, probes)


def test_when_every_connection_is_busy_with_a_request_one_more_is_refused_at_once(tmp_path):
    """Connections busy with a request (a body still arriving) are never closed to make room: one more gets 503."""
    env = {"CAPWATCH_MAX_CONNECTIONS": "32", "CAPWATCH_MAX_CONCURRENT_BODIES": "64",
           "CAPWATCH_MAX_BODIES_PER_CLIENT": "64", "CAPWATCH_BODY_TIMEOUT_S": "30"}
    with ServiceProcess(tmp_path / "busy.db", env=env) as small:
        held = [connect(small.port) for _ in range(32)]
        try:
            for sock in held:
                sock.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n{")
            time.sleep(1.0)  # past the body grace: each holds a body slot, busy
            with connect(small.port) as extra:
                answer = read_all(extra, timeout_s=5)
            assert answer == b"" or status_of(answer) == 503
            assert b"busy with a request" in answer or answer == b""
        finally:
            for sock in held:
                sock.close()
        text = httpx.get(small.url + "/metrics", timeout=10).text
        assert 'capwatch_connections_dropped_total{reason="too_many_connections"} 1.0' in text
        assert 'capwatch_connections_dropped_total{reason="evicted_idle"} 0.0' in text


def test_an_idle_connection_gives_its_place_to_a_newcomer_and_the_drop_is_counted(tmp_path):
    with ServiceProcess(tmp_path / "idle.db", env={"CAPWATCH_MAX_CONNECTIONS": "32"}) as small:
        held = [connect(small.port) for _ in range(32)]
        try:
            time.sleep(0.3)
            with connect(small.port) as newcomer:
                newcomer.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                assert status_of(read_all(newcomer)) == 200
            assert read_all(held[0], timeout_s=5) == b""  # the oldest idle one was closed for it
        finally:
            for sock in held:
                sock.close()
        text = httpx.get(small.url + "/metrics", timeout=10).text
        assert 'capwatch_connections_dropped_total{reason="evicted_idle"} 1.0' in text  # the one place it gave
