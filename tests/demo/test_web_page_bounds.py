"""The built-in page at the edges of issue #20, in real headless Chromium against a real `capwatch serve` (the
installed ``.venv-service``, started outside the checkout): a group running the largest cap gets its what-if chart
(the page asked for caps above 2^20 and got 422), and a service whose reads need the token asks for it instead of
failing."""

from __future__ import annotations

import json
import time

import httpx

from capwatch.sizing.caps import MAX_CAP_TOKENS
from tests.demo.test_web_page import PageElements
from tests.service.conftest import JSON
from tests.support.chromium import chromium, needs_chromium
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, needs_service_venv
from tests.support.simulate import SimulatedRank

pytestmark = [needs_chromium, needs_service_venv]


def installed(folder, env: dict[str, str] | None = None) -> ServiceProcess:
    return ServiceProcess(folder / "capwatch.db", env=env, python=INSTALLED_PYTHON, cwd=folder)


def page_of(tmp_path, url: str) -> PageElements:
    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = PageElements()
    page.feed(dom.stdout)
    return page


def test_a_group_at_the_largest_cap_gets_its_what_if_chart(tmp_path):
    with installed(tmp_path) as service, httpx.Client(base_url=service.url, headers=JSON) as client:
        rank = SimulatedRank("edge", 0, 1, cap=MAX_CAP_TOKENS)
        start = time.time() - 3600
        for window in range(30):
            body = rank.report(start + 60 * window, start + 60 * window + 59, [800_000, 1_000_000])
            assert client.post("/v1/reports", content=json.dumps(body)).status_code == 202
        page = page_of(tmp_path, f"{service.url}/?cluster=edge")
    assert page.body.get("data-ready") == "1", page.body
    # Every cap it asked for was within the range: one beyond it is a 422 and an empty chart (0 points).
    assert int(page.body["data-whatif-points"]) >= 5
    assert "whatif" not in page.text_by_id.get("message", "")


def test_a_service_whose_reads_need_the_token_asks_for_it(tmp_path):
    env = {"CAPWATCH_TOKEN": "s3cret", "CAPWATCH_READS_NEED_TOKEN": "true"}
    with installed(tmp_path, env) as service:
        page = page_of(tmp_path, f"{service.url}/")
    assert page.body.get("data-ready") == "token", page.body
    assert "needs its token" in page.text_by_id["message"]
