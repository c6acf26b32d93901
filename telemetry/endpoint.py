"""The one check of a service's base URL and of a bearer token, wherever they are set: a rank's reporter
(the SGLang plugin's ``CAPWATCH_SERVICE_URL`` and ``CAPWATCH_TOKEN``), the service's own token and Prometheus
URL, and ``capwatch advise --url``. A value that passes can be sent in every request; one that fails is refused
where it is set, in one line, instead of failing every send later."""

from __future__ import annotations

from urllib.parse import urlsplit

MAX_TOKEN_CHARS = 4096


def _control_or_space(text: str) -> str | None:
    for char in text:
        if ord(char) <= 0x20 or ord(char) == 0x7F:
            return repr(char)
    return None


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) base URL with a host (and a port in 1..65535 if it names one), or None.
    Refused: whitespace and control characters (CR/LF would split a request), non-ASCII text (give a name's
    punycode form), user:password@ (send the token instead), a query or a fragment (paths are appended)."""
    like = "like http://127.0.0.1:8321"
    bad = _control_or_space(url)
    if bad is not None:
        return f"it contains the character {bad}; give an http(s) URL {like}"
    if not url.isascii():
        return f"it contains non-ASCII text; give an http(s) URL {like} (a host name in its punycode form)"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"it is not an http(s) URL with a host, {like}"
    try:
        port = parts.port
    except ValueError:
        return f"its port {parts.netloc.rpartition(':')[2]!r} is not a number in 1..65535"
    if port == 0:
        return "its port 0 is not one a service listens on (1..65535)"
    if parts.username is not None or parts.password is not None:
        return "it carries user:password@, which is never sent; give the token as the token setting instead"
    if parts.query or parts.fragment:
        return f"it has a query or fragment; give the service's base URL, {like}"
    return None


def bearer_token_problem(token: str) -> str | None:
    """Why ``token`` cannot be sent as ``Authorization: Bearer <token>``, or None: it must be 1..4096 visible
    ASCII characters (no spaces, CR/LF or other control characters, which would break or split the header)."""
    if not token:
        return "it is empty"
    if len(token) > MAX_TOKEN_CHARS:
        return f"it is {len(token)} characters long; at most {MAX_TOKEN_CHARS}"
    bad = _control_or_space(token)
    if bad is not None:
        return f"it contains the character {bad}; use visible ASCII characters only"
    if not token.isascii():
        return "it contains non-ASCII text; use visible ASCII characters only (e.g. a hex or base64 secret)"
    return None
