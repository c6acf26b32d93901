"""Per-rank Prometheus exporter: its own registry, served on base port + local rank (default 9470 + local
rank, on 127.0.0.1: ``ports.py`` says why), or mounted into an existing server.

Never the global ``REGISTRY``: two ranks (or two tests) in one process would collide on it, and
prometheus_client's multiprocess mode would break the custom collector and add a ``pid`` label.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from capwatch.telemetry.exposition import ExpositionRegistry
from capwatch.telemetry.ports import DEFAULT_BASE_PORT
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app, start_http_server
from prometheus_client.registry import Collector

from capwatch.telemetry.endpoint import bind_host_problem

MAX_PORT = 65535


@dataclass(frozen=True)
class ExporterOptions:
    """Where one rank serves ``/metrics``: ``base_port + local_rank`` on ``host``.
    ``base_port=0`` asks the OS for a free port (tests); loopback unless told otherwise."""

    base_port: int = DEFAULT_BASE_PORT
    local_rank: int = 0
    host: str = "127.0.0.1"
    legacy_group_label: bool = False  # for one release, the old 'cluster' label beside 'ep_group' (exposition.py)

    def __post_init__(self) -> None:
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")
        if not 0 <= self.base_port <= MAX_PORT or (self.base_port and self.port > MAX_PORT):
            raise ValueError(
                f"exporter port {self.base_port} + local rank {self.local_rank} is outside 1..{MAX_PORT}; "
                "choose a lower base port")
        problem = bind_host_problem(self.host)
        if problem is not None:
            raise ValueError(f"exporter host {self.host[:100]!r}: {problem}")

    @property
    def port(self) -> int:
        return self.base_port + self.local_rank if self.base_port else 0


class RankExporter:
    """Holds the registry with the rank's collectors; serves it over HTTP and/or as an ASGI app."""

    def __init__(self, *collectors: Collector, registry: CollectorRegistry | None = None,
                 legacy_group_label: bool = False):
        """``registry``: one of the caller's (as given); by default capwatch's own (build info, no ``*_created``;
        ``legacy_group_label``: the old ``cluster`` label beside ``ep_group``, telemetry/exposition.py)."""
        self.registry = registry if registry is not None else ExpositionRegistry(legacy_group_label=legacy_group_label)
        for collector in collectors:
            self.registry.register(collector)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, options: ExporterOptions = ExporterOptions()) -> int:
        """Start the HTTP server on a daemon thread; returns the bound port."""
        if self._server is not None:
            raise RuntimeError(f"exporter already serving on port {self.port}")
        try:
            self._server, self._thread = start_http_server(options.port, addr=options.host, registry=self.registry)
        except OSError as error:
            raise OSError(
                error.errno,
                f"cannot serve /metrics on {options.host}:{options.port} ({error.strerror}); "
                "pick another base port or free that one") from error
        return self.port

    @property
    def port(self) -> int | None:
        return self._server.server_port if self._server is not None else None

    @property
    def url(self) -> str | None:
        if self._server is None:
            return None
        host = self._server.server_address[0]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def asgi_app(self):
        """An ASGI app serving this registry, to mount into an existing server (e.g. at ``/metrics``)."""
        return make_asgi_app(registry=self.registry)

    def render(self) -> bytes:
        """The text exposition, as a scrape would get it."""
        return generate_latest(self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None
