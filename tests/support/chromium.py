"""Real headless Chromium (Debian's package), started the one way the page tests share: a profile of the test's
own, nothing fetched but what the page asks for, virtual time so the page's scripts finish before the dump."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1800"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make system-deps)")


def chromium(folder: Path, *arguments: str, virtual_time_ms: int = 15_000) -> subprocess.CompletedProcess:
    """Chromium with ``arguments`` (``--dump-dom URL``, ``--screenshot=PATH URL``), its profile under ``folder``."""
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={folder / 'chromium-profile'}",
                           f"--virtual-time-budget={virtual_time_ms}", *arguments],
                          capture_output=True, text=True, timeout=120)


class PageElements(HTMLParser):
    """The attributes of the elements the test looks at."""

    def __init__(self):
        super().__init__()
        self.body: dict[str, str] = {}
        self.series: list[dict[str, str]] = []  # elements carrying data-series
        self.text_by_id: dict[str, str] = {}
        self._open_id: str | None = None

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        if tag == "body":
            self.body = attributes
        if "data-series" in attributes:
            self.series.append(dict(attributes, tag=tag))
        self._open_id = attributes.get("id")

    def handle_data(self, data):
        if self._open_id:
            self.text_by_id[self._open_id] = self.text_by_id.get(self._open_id, "") + data

    def handle_endtag(self, tag):
        self._open_id = None


def evaluate_on_page(folder: Path, url: str, expression: str, *, width: int = 1400, height: int = 1000,
                     timeout_s: float = 90) -> object:
    """Open ``url`` in a real headless Chromium whose viewport is ``width`` x ``height`` CSS pixels (set through
    the DevTools protocol, so the layout is that of a 1400 x 1000 window), wait until the page says it is drawn
    (``body[data-ready]`` set and not "0"), and return what ``expression`` (a JavaScript expression, evaluated in
    the page) gives, as JSON. Layout questions (is it visible without scrolling?) need the live page, which
    ``--dump-dom`` does not keep. ``expression`` is an arrow function's body: an expression, or a ``{ ... }``
    block that returns."""
    import json
    import time
    import urllib.request

    from websockets.sync.client import connect

    from tests.support.ports import free_port

    port = free_port()
    process = subprocess.Popen([CHROMIUM, *[flag for flag in FLAGS if not flag.startswith("--window-size")],
                                f"--window-size={width},{height}", f"--user-data-dir={folder / 'chromium-cdp'}",
                                f"--remote-debugging-port={port}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        socket_url = None
        while socket_url is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                    socket_url = next((target["webSocketDebuggerUrl"] for target in json.load(answer)
                                       if target.get("type") == "page"), None)
            except OSError:
                pass
            if socket_url is None:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError("chromium's DevTools endpoint did not come up")
                time.sleep(0.2)
        with connect(socket_url, max_size=None, open_timeout=30) as socket:
            counter = iter(range(1, 1 << 30))

            def call(method: str, **params):
                ident = next(counter)
                socket.send(json.dumps({"id": ident, "method": method, "params": params}))
                while True:
                    message = json.loads(socket.recv(timeout=max(1.0, deadline - time.monotonic())))
                    if message.get("id") == ident:
                        if "error" in message:
                            raise AssertionError(f"{method}: {message['error']}")
                        return message.get("result", {})

            call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=url)
            waited = ("new Promise((resolve, reject) => { const check = () => { try { "
                      "if (document.body && document.body.dataset.ready && document.body.dataset.ready !== '0') "
                      "resolve(JSON.stringify((() => " + expression + ")())); else setTimeout(check, 100); } "
                      "catch (error) { reject(error); } }; check(); })")
            while True:
                try:
                    result = call("Runtime.evaluate", expression=waited, awaitPromise=True, returnByValue=True)
                    break
                except AssertionError as error:  # the navigation replaced the context under the first try
                    if "context" not in str(error) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            if "exceptionDetails" in result:
                raise AssertionError(f"the page's expression failed: {result['exceptionDetails']}")
            return json.loads(result["result"]["value"])
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
