"""The HTTP server ``capwatch serve`` runs: uvicorn's httptools protocol with every connection bounded, so no
client can hold the service's memory, file descriptors or event loop:

- at most ``max_connections`` open at once, shared fairly per address: when they are all taken, a new connection
  takes the place of an idle one (no request in progress), else of a slow one (headers still arriving, or an
  answer its client does not read in time), from its own address when that holds its share (an eighth) or more,
  else from the address holding the most; only when every connection is busy with a request is it answered 503
  and closed at once. So a client re-opening every slot it can get cannot lock the others (or ``/healthz``) out;
- the request line and headers must arrive within ``header_timeout_s`` of the connection opening (or of the
  previous answer), and be at most ``MAX_HEADER_BYTES`` (408 and 431, then closed): a client that never finishes
  its headers is closed, not kept;
- at most ``MAX_PIPELINED`` requests may wait behind the one being answered (a client pipelining more is dropped);
- at most ``output_buffer_bytes`` of answers are buffered for one client (in the process, and as the socket's send
  buffer in the kernel): past it the answer waits for the client to read, and a client that takes nothing for
  ``send_timeout_s`` is dropped with what was buffered for it. Answers reach the connection in pieces
  (``capwatch.service.api.guard``, ``capwatch.service.api.streaming``), so one answer cannot overshoot the bound.

uvicorn has none of these bounds (a connection that sends nothing is kept for ever, and an answer is buffered
whole whether or not the client reads it); they are added to its protocol here, and ``capwatch serve`` runs it.
Each drop is counted (``capwatch_connections_dropped_total{reason}``) and logged at most once a minute per reason.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httptools
import uvicorn
from capwatch.service.config import Settings
from capwatch.service.gc_schedule import scheduled_full_collections
from capwatch.service.vocabulary import DropReason
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

log = logging.getLogger(__name__)

# The request line and headers of one request: a rank sends a few hundred bytes, a browser a few KiB.
MAX_HEADER_BYTES = 32 * 1024
# Requests parsed and waiting behind the one being answered (HTTP/1.1 pipelining): each costs memory until answered.
MAX_PIPELINED = 16
LOG_EVERY_S = 60.0



@dataclass
class DropLog:
    """Counts every drop, and logs one line per reason at most every ``LOG_EVERY_S`` (a flood is one line)."""

    count: Callable[[DropReason], None] = lambda reason: None
    _logged: dict[str, float] = field(default_factory=dict)
    _since: dict[str, int] = field(default_factory=dict)

    def __call__(self, reason: DropReason, client: tuple | None, detail: str) -> None:
        self.count(reason)
        self._since[reason] = self._since.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(reason, float("-inf")) >= LOG_EVERY_S:
            log.warning("dropped a connection from %s: %s (%d such drop(s) since the last line)",
                        client[0] if client else "an unknown client", detail, self._since.pop(reason))
            self._logged[reason] = now


class ConnectionTable:
    """The admitted connections by client address, in the order they opened, and the choice of one to close
    when a new one needs its place (see the module's docstring). One per server; the event loop's thread only."""

    SHARE_DIVISOR = 8  # an address's fair share when connections are scarce, as for body slots

    def __init__(self) -> None:
        self.by_address: dict[str, dict[BoundedHttpProtocol, None]] = {}  # insertion order: oldest first
        self.open = 0

    def add(self, connection: BoundedHttpProtocol) -> None:
        self.by_address.setdefault(connection.address, {})[connection] = None
        self.open += 1

    def remove(self, connection: BoundedHttpProtocol) -> None:
        held = self.by_address.get(connection.address)
        if held is not None and held.pop(connection, False) is None:
            self.open -= 1
            if not held:
                del self.by_address[connection.address]

    def victim(self, address: str, max_connections: int) -> BoundedHttpProtocol | None | bool:
        """None when there is room; else the connection to close for one more from ``address``, or False when
        every candidate is busy with a request (the new one is refused)."""
        if self.open < max_connections:
            return None
        held = self.by_address.get(address, {})
        if len(held) >= max(1, max_connections // self.SHARE_DIVISOR):
            return _first_evictable([held]) or False
        largest = max(self.by_address.values(), key=len)
        return _first_evictable([largest]) or _first_evictable(list(self.by_address.values())) or False


def _first_evictable(groups: list[dict]) -> BoundedHttpProtocol | None:
    """The oldest idle connection of ``groups``, else the oldest slow one."""
    slow = None
    for group in groups:
        for connection in group:
            state = connection.evictable()
            if state == "idle":
                return connection
            if state == "slow" and slow is None:
                slow = connection
    return slow


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    send_timeout_s: float
    output_buffer_bytes: int
    dropped: DropLog = field(default_factory=DropLog)
    table: ConnectionTable = field(default_factory=ConnectionTable)

    @classmethod
    def of(cls, settings: Settings, count: Callable[[DropReason], None] = lambda reason: None) -> ConnectionLimits:
        return cls(settings.max_connections, settings.header_timeout_s, settings.send_timeout_s,
                   settings.output_buffer_bytes, DropLog(count))


def plain_answer(status: int, detail: str) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection (for refusals made before any ASGI app runs)."""
    body = detail.encode()
    return b"".join([STATUS_LINE[status], b"content-type: text/plain; charset=utf-8\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])


class _Stop(Exception):
    """Raised from a parser callback to stop parsing this connection's input."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol within ``ConnectionLimits`` (see the module's docstring)."""

    def __init__(self, *args, limits: ConnectionLimits, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._refused = False  # over max_connections: answered 503, closing
        self.address = ""  # the client's address: connections are shared per address
        self._header_timer: asyncio.TimerHandle | None = None
        self._output_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._in_headers = False
        self._stop: tuple[DropReason, int | None, str] | None = None  # why parsing stopped: reason, status (None: drop)

    # --- connections ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        table = self.limits.table
        victim = table.victim(self.address, self.limits.max_connections)
        if victim is False:
            self._refused = True
            self.transport = transport
            self.client = peer
            transport.write(plain_answer(503, f"the service holds {self.limits.max_connections} connections, its "
                                              "bound (CAPWATCH_MAX_CONNECTIONS), each busy with a request; retry "
                                              "later\n"))
            transport.close()
            self.limits.dropped("too_many_connections", self.client,
                                f"{self.limits.max_connections} connections are open and busy (CAPWATCH_MAX_CONNECTIONS)")
            return
        if victim is not None:
            victim.evict()
        super().connection_made(transport)
        table.add(self)
        transport.set_write_buffer_limits(high=self.limits.output_buffer_bytes)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # the kernel's share too: its default grows to MiBs per connection a client ignores
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.output_buffer_bytes)
        self._arm_header_timer()

    def evictable(self) -> str | None:
        """``"idle"`` (no request in progress), ``"slow"`` (headers still arriving, or an answer not read as fast
        as it is written), or None (busy with a request: never closed to make room)."""
        if self.transport.is_closing():
            return None
        if self._in_headers or self.flow.write_paused:
            return "slow"
        if not self.pipeline and (self.cycle is None or self.cycle.response_complete):
            return "idle"
        return None

    def evict(self) -> None:
        """Close this connection to make room for a new one (counted and logged as a drop)."""
        state = self.evictable()
        self.limits.table.remove(self)
        if state == "idle":
            self.transport.close()
        else:
            self.transport.abort()  # frees what was buffered for it
        self.limits.dropped(f"evicted_{state}", self.client,
                            f"its place was taken by a new connection ({self.limits.max_connections} were open, "
                            f"CAPWATCH_MAX_CONNECTIONS; this one was {state})")

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._header_timer, self._output_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._output_timer = None
        if not self._refused:
            self.limits.table.remove(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, less its log line per malformed request (a flood of them is one line a minute here)."""
        if self._refused or self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no WebSocket here (ws="none"): the request is answered as plain HTTP
        except httptools.HttpParserError:
            reason, status, detail = self._stop or ("malformed_request", 400, "the request is not valid HTTP/1.1\n")
            if status is not None:
                self.transport.write(plain_answer(status, detail))
                self.transport.close()
            else:  # answers are in flight: nothing more can be said on this connection
                self.transport.abort()
            self.limits.dropped(reason, self.client, detail.strip())

    # --- the request line and headers: in time, and bounded ------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timed_out)

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._in_headers:  # a request was begun and not finished: say why it is cut
            self.transport.write(plain_answer(408, f"the request headers did not arrive within "
                                                   f"{self.limits.header_timeout_s:g} s (CAPWATCH_HEADER_TIMEOUT_S)\n"))
        self.transport.close()
        self.limits.dropped("header_timeout", self.client,
                            f"no complete request headers within {self.limits.header_timeout_s:g} s")

    def on_message_begin(self) -> None:
        self._header_bytes = 0
        self._in_headers = True
        super().on_message_begin()

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            self._stop = ("header_too_large", 431, f"the request line and headers exceed {MAX_HEADER_BYTES} bytes\n")
            raise _Stop

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()
        if len(self.pipeline) > MAX_PIPELINED:
            self._stop = ("pipelined", None, f"more than {MAX_PIPELINED} requests pipelined unanswered")
            raise _Stop

    def on_response_complete(self) -> None:
        waiting = bool(self.pipeline)
        super().on_response_complete()
        if not waiting and not self.transport.is_closing():
            self._arm_header_timer()  # the next request's headers: in time too

    # --- answers: bounded, and dropped when the client does not read -------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_output(self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        if self._output_timer is not None:
            self._output_timer.cancel()
            self._output_timer = None
        super().resume_writing()

    def _watch_output(self, buffered: int) -> None:
        if self._output_timer is not None:
            self._output_timer.cancel()
        self._output_timer = self.loop.call_later(self.limits.send_timeout_s, self._output_checked, buffered)

    def _output_checked(self, buffered_then: int) -> None:
        """While writing is paused nothing more is written, so the buffer only shrinks as the client reads."""
        self._output_timer = None
        if self.transport.is_closing() or not self.flow.write_paused:
            return
        buffered = self.transport.get_write_buffer_size()
        if buffered < buffered_then:  # it reads, slowly: wait on
            self._watch_output(buffered)
            return
        self.transport.abort()  # frees what was buffered for it; the answer's sends return at once
        self.limits.dropped("not_reading", self.client,
                            f"it read nothing of its answer for {self.limits.send_timeout_s:g} s "
                            f"({buffered} bytes buffered; CAPWATCH_SEND_TIMEOUT_S)")


def protocol_factory(limits: ConnectionLimits) -> Callable[..., BoundedHttpProtocol]:
    """What ``uvicorn.Config(http=...)`` takes: the bounded protocol with these limits."""
    return functools.partial(BoundedHttpProtocol, limits=limits)


def bounded_server(app, settings: Settings, log_level: str = "info") -> uvicorn.Server:
    """The uvicorn server ``capwatch serve`` runs: ``app`` behind the bounded protocol, with ``settings``' limits
    (its drops counted in the app's metrics). Run it with :func:`serve`."""
    limits = ConnectionLimits.of(settings, app.state.metrics.count_dropped_connection)
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, http=protocol_factory(limits),
                                         ws="none"))


def serve(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Run ``server`` on ``sockets`` until it is told to exit, with full garbage collections on the service's
    schedule (``capwatch.service.gc_schedule``): the process is a server now."""
    with scheduled_full_collections():  # no stop-the-world pause every few seconds under load
        server.run(sockets=sockets)
