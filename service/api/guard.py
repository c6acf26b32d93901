"""Rules for every request, before any route (and outside the app's own error handling, so they hold for a
500 too): the ``Host`` it was sent to, each header that a rule reads given once, the token on reads when the
service asks for it, and the conventional security headers on every answer, handed to the server in chunks.

- ``Host`` must be a host name or address with an optional port, and one of ``allowed_hosts`` (loopback names by
  default): a page on another origin that points its own DNS name at 127.0.0.1 (DNS rebinding) sends its own
  name, and is refused (421); ``127.0.0.1:8321@evil.example`` is no host at all (400). A liveness probe
  (``GET /healthz``) is answered whatever its Host (Kubernetes sends the pod's IP), with its status alone.
- Two ``Authorization``, ``Host``, ``Origin``, ``Content-Type`` or ``Content-Length`` headers are refused (400)
  on every path: a proxy or client library that keeps the first and one that keeps the last must not see
  different requests (the report fast path reads raw headers, the router the first of each).
- With ``reads_need_token``, reads of the data (``/v1/...``, ``/metrics``) need ``Authorization: Bearer <token>``
  too (401); ``/healthz``, the page's own files and ``/openapi.json`` hold no data and stay open. Writes are
  checked by the report rules (``report_rules.py``).
- Headers: no sniffing, no framing, no referrer, and a Content-Security-Policy that lets the
  built-in page load its own scripts and styles and talk to its own origin only.
- A large answer reaches the server ``ANSWER_CHUNK_BYTES`` at a time, so each piece waits for the client to
  read the previous ones (``capwatch.service.http_server`` bounds what is buffered per connection).
"""

from __future__ import annotations

import re

from capwatch.service.api.deps import bearer_token_accepted
from capwatch.service.api.report_rules import json_detail
from capwatch.service.config import Settings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
)
# Headers a rule reads: each must come once.
SINGLE_HEADERS = (b"authorization", b"host", b"origin", b"content-type", b"content-length")
ANSWER_CHUNK_BYTES = 16 * 1024
# RFC 3986's host (a registered name, an IPv4 address, or an IPv6 address in brackets) and an optional port.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._~-]+))(?::[0-9]{1,5})?")


def host_name(host_header: str) -> str | None:
    """``name:port``, ``[v6]:port`` or a bare name -> the name, lower case, without brackets; None when the
    header is not a host and optional port at all (``127.0.0.1:8321@evil.example``, ``a/b``, ``a:b:c``)."""
    match = _HOST.fullmatch(host_header.strip())
    if match is None:
        return None
    return (match.group("v6") or match.group("name")).lower()


def reads_data(scope: Scope) -> bool:
    """A request for the service's data (every path under /v1/ but the report write, and /metrics)."""
    path = scope["path"][len(scope.get("root_path", "")):]
    if scope["method"] == "POST" and path == "/v1/reports":
        return False
    return path.startswith("/v1/") or path == "/metrics"


# Set on a probe's scope when its Host is not one the service answers for: /healthz then says its status alone.
HOST_NOT_ALLOWED = "capwatch.host_not_allowed"


def probe(scope: Scope) -> bool:
    """A liveness probe: ``GET``/``HEAD /healthz``. Kubernetes' httpGet probes send ``Host: <pod IP>:<port>``,
    which no allowlist of names holds, so a probe is answered whatever its (well-formed) Host: it reads no data,
    and a probe whose Host is not allowed gets the status without the problem's words (they name the file)."""
    path = scope["path"][len(scope.get("root_path", "")):]
    return scope["method"] in ("GET", "HEAD") and path == "/healthz"


class RequestGuard:
    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings
        self.any_host = "*" in settings.allowed_hosts
        self.allowed = {name.lower().strip("[]") for name in settings.allowed_hosts}

    def _refusal(self, scope: Scope) -> tuple[int, str, tuple] | None:
        seen: dict[bytes, list[bytes]] = {}
        for name, value in scope["headers"]:
            if name in SINGLE_HEADERS:
                seen.setdefault(name, []).append(value)
        for name, values in seen.items():
            if len(values) > 1:
                return 400, f"send one {name.decode().title()} header, not several", ()
        hosts = seen.get(b"host", [])
        host = hosts[0].decode("latin-1") if hosts else None
        name = host_name(host) if host is not None else None
        if host is not None and name is None:
            return 400, f"the Host header {host[:100]!r} is not a host name or address with an optional port", ()
        if not self.any_host and name not in self.allowed and not probe(scope):
            return 421, (f"this service answers for {', '.join(sorted(self.allowed))}, not "
                         f"{host[:100] if host else 'a request without Host'!r}; add the name it is served "
                         "under to CAPWATCH_ALLOWED_HOSTS"), ()
        if self.settings.reads_need_token and reads_data(scope):
            authorization = seen.get(b"authorization", [b""])[0].decode("latin-1")
            if not bearer_token_accepted(authorization, self.settings):
                return 401, ("reads need 'Authorization: Bearer <token>' with the service's CAPWATCH_TOKEN "
                             "(CAPWATCH_READS_NEED_TOKEN)"), ((b"www-authenticate", b"Bearer"),)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await _refuse(send, *refusal)
            return
        if probe(scope) and not self.any_host:
            host = next((value for name, value in scope["headers"] if name == b"host"), None)
            if host is None or host_name(host.decode("latin-1")) not in self.allowed:
                scope = {**scope, HOST_NOT_ALLOWED: True}

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            elif message["type"] == "http.response.body" and len(message.get("body", b"")) > ANSWER_CHUNK_BYTES:
                body, more = message["body"], message.get("more_body", False)
                for start in range(0, len(body) - ANSWER_CHUNK_BYTES, ANSWER_CHUNK_BYTES):
                    await send({"type": "http.response.body", "body": body[start:start + ANSWER_CHUNK_BYTES],
                                "more_body": True})
                last = (len(body) - 1) // ANSWER_CHUNK_BYTES * ANSWER_CHUNK_BYTES
                message = {"type": "http.response.body", "body": body[last:], "more_body": more}
            await send(message)

        await self.app(scope, receive, send_guarded)


async def _refuse(send: Send, status: int, detail: str, headers: tuple = ()) -> None:
    body = json_detail(detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers, *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
