"""The one check of a service's base URL and of a bearer token, wherever they are set: a rank's reporter
(the SGLang plugin's ``CAPWATCH_SERVICE_URL`` and ``CAPWATCH_TOKEN``), the service's own token and Prometheus
URL, and ``capwatch advise --url``. A value that passes can be sent in every request; one that fails is refused
where it is set, in one line, instead of failing every send later."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

MAX_TOKEN_CHARS = 4096
MAX_HOST_NAME_CHARS = 253  # DNS: a name of at most 253 characters, each label 1..63
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")


def host_name_problem(host: str) -> str | None:
    """Why ``host`` is neither an IP address nor a DNS host name (labels of letters, digits and inner hyphens,
    at most 253 characters), or None. A name of digits and dots must be an IPv4 address (``256.1.1.1`` is none)."""
    if not host:
        return "it is empty"
    if len(host) > MAX_HOST_NAME_CHARS:
        return f"it is {len(host):,} characters long; a host name has at most {MAX_HOST_NAME_CHARS}"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if _DOTTED_NUMBERS.fullmatch(host):
        return f"{host!r} is not an IPv4 address (four numbers 0..255)"
    if not all(_LABEL.fullmatch(label) for label in host.removesuffix(".").split(".")):
        return (f"{host[:100]!r} is neither an IP address nor a host name (letters, digits and hyphens, a hyphen "
                "never first or last in a label)")
    return None


def bind_host_problem(host: str) -> str | None:
    """Why ``host`` is not an address this machine can listen on, or None: an IP address (0.0.0.0 or :: for
    every interface) or ``localhost``. A name may resolve elsewhere, or nowhere; give its address instead."""
    if host == "localhost":
        return None
    problem = host_name_problem(host)
    if problem is not None:
        return problem
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"{host[:100]!r} is a name, not an address to listen on; give an IP address (127.0.0.1, 0.0.0.0, ::)"
    return None


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
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError as error:  # an unclosed or misplaced bracket ("http://[::1", "http://a]b:1")
        return f"it is not a URL ({error}); give an http(s) URL {like}"
    if parts.scheme not in ("http", "https") or not hostname:
        return f"it is not an http(s) URL with a host, {like}"
    if "[" in parts.netloc:
        try:
            if ipaddress.ip_address(hostname).version != 6:
                raise ValueError(hostname)
        except ValueError:
            return f"its bracketed host {hostname[:100]!r} is not an IPv6 address; give an http(s) URL {like}"
    else:
        problem = host_name_problem(hostname)
        if problem is not None:
            return f"its host: {problem}"
    try:
        port = parts.port
    except ValueError:
        return f"its port {parts.netloc.rpartition(':')[2][:20]!r} is not a number in 1..65535"
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
