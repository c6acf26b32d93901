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
