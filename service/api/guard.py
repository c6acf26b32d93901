"""Rules for every request, before any route: the ``Host`` it was sent to, one ``Authorization``
header at most, and the conventional security headers on every answer.

- ``Host`` must be one of ``allowed_hosts`` (loopback names by default): a page on another origin
  that points its own DNS name at 127.0.0.1 (DNS rebinding) sends its own name, and is refused (421).
- Two ``Authorization`` headers are refused (400) on every path: a proxy or client library that
  keeps the first and one that keeps the last must not see different tokens.
- Headers: no sniffing, no framing, no referrer, and a Content-Security-Policy that lets the
  built-in page load its own scripts and styles and talk to its own origin only.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capwatch.service.api.report_rules import json_detail

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
)


def host_name(host_header: str) -> str:
    """``name:port``, ``[v6]:port`` or a bare name -> the name, lower case, without brackets."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


class RequestGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: list[str]):
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.allowed = {name.lower().strip("[]") for name in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts, authorizations = [], 0
        for name, value in scope["headers"]:
            if name == b"host":
                hosts.append(value.decode("latin-1"))
            elif name == b"authorization":
                authorizations += 1
        if authorizations > 1:
            await _refuse(send, 400, "send one Authorization header, not several")
            return
        if not self.any_host and (len(hosts) != 1 or host_name(hosts[0]) not in self.allowed):
            await _refuse(send, 421, f"this service answers for {', '.join(sorted(self.allowed))}, not "
                                     f"{hosts[0] if hosts else 'a request without Host'!r}; add the name it is served "
                                     "under to CAPWATCH_ALLOWED_HOSTS")
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json_detail(detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
