"""A small real peer for the reporter: an HTTP server that accepts ``POST /v1/reports`` like the
service does (validates with the shared ``RankReport`` model, drops ``(boot_id, sequence)``
duplicates) and can go down (connection refused), come back on the same port, hang, drop the
connection, or answer with raw broken bytes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import ValidationError

from capwatch.telemetry.report import RankReport

MAX_BODY_BYTES = 4 << 20


class ReportSink:
    def __init__(self, bearer_token: str | None = None):
        self.bearer_token = bearer_token
        self.reports: dict[tuple[str, int], RankReport] = {}
        self.duplicates = 0
        self.invalid: list[str] = []
        self.unauthorized = 0
        self.hang = threading.Event()  # set: hold every request until released
        self.release = threading.Event()
        self.responses_to_lose = 0  # process the next N reports but drop the connection instead of answering
        # Process the next reports but answer each with these raw bytes instead (a broken HTTP response).
        self.raw_responses: list[bytes] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "ReportSink":
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (stdlib name)
                if sink.hang.is_set():
                    sink.release.wait(timeout=60)
                status, body = sink.receive(self.path, self.headers, self.rfile)
                with sink._lock:
                    lose = sink.responses_to_lose > 0
                    sink.responses_to_lose -= lose
                    raw = sink.raw_responses.pop(0) if sink.raw_responses and not lose else None
                if lose:  # the service stored it, the rank never hears back: it must retry
                    self.close_connection = True
                    return
                if raw is not None:  # stored, but the answer is broken on the wire: the rank must retry
                    self.close_connection = True
                    self.wfile.write(raw)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_port  # kept, so a restart comes back on the same address
        self._server = server
        threading.Thread(target=server.serve_forever, name="report-sink", daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the listening socket: the reporter gets connection refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- what the service does with a report -----------------------------------------------------

    def receive(self, path, headers, body_stream) -> tuple[int, bytes]:
        if path != "/v1/reports":
            return 404, b'{"detail":"not found"}'
        if self.bearer_token and headers.get("Authorization") != f"Bearer {self.bearer_token}":
            with self._lock:
                self.unauthorized += 1
            return 401, b'{"detail":"bad token"}'
        length = int(headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return 413, b'{"detail":"too large"}'
        try:
            report = RankReport.model_validate_json(body_stream.read(length))
        except ValidationError as error:
            with self._lock:
                self.invalid.append(str(error))
            return 422, b'{"detail":"invalid report"}'
        key = (report.identity.boot_id, report.sequence)
        with self._lock:
            duplicate = key in self.reports
            if duplicate:
                self.duplicates += 1
            else:
                self.reports[key] = report
        return 202, b'{"accepted":true,"duplicate":%s}' % (b"true" if duplicate else b"false")

    # --- views for assertions ---------------------------------------------------------------------

    def by_boot(self) -> dict[str, list[RankReport]]:
        with self._lock:
            reports = list(self.reports.values())
        boots: dict[str, list[RankReport]] = {}
        for report in sorted(reports, key=lambda report: report.sequence):
            boots.setdefault(report.identity.boot_id, []).append(report)
        return boots

    def boots_of(self, ep_rank: int) -> dict[str, list[RankReport]]:
        return {boot: reports for boot, reports in self.by_boot().items() if reports[0].identity.ep_rank == ep_rank}
