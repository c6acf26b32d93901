"""A page on another local origin cannot write to the service, in real headless Chromium against a
real ``capwatch serve`` (the non-editable ``.venv-service`` install, started outside the checkout): a ``no-cors`` text/plain post (no preflight), a JSON-typed blob, and a CORS
JSON post are all refused and nothing is stored, while the built-in page keeps working."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import urllib.request
from html.parser import HTMLParser

from tests.support.chromium import chromium, needs_chromium
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, free_port, needs_service_venv
from tests.support.simulate import SimulatedRank

pytestmark = [needs_chromium, needs_service_venv]

ATTACK = """<!doctype html><html><body><script>
const target = %(target)s, body = %(body)s;
async function attempt(name, options) {
  try { const response = await fetch(target, {method: "POST", body, ...options});
        return name + ":" + (response.type === "opaque" ? "opaque" : response.status); }
  catch (error) { return name + ":blocked"; }
}
(async () => {
  const results = [
    await attempt("plain", {mode: "no-cors", headers: {"Content-Type": "text/plain"}}),
    await attempt("blob", {mode: "no-cors", body: new Blob([body], {type: "application/json"})}),
    await attempt("cors", {headers: {"Content-Type": "application/json"}}),
  ];
  document.body.setAttribute("data-results", results.join(" "));
})();
</script></body></html>"""


class Body(HTMLParser):
    def __init__(self):
        super().__init__()
        self.attributes: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self.attributes = {name: value or "" for name, value in attrs}


def dump_dom(tmp_path, url: str) -> dict[str, str]:
    result = chromium(tmp_path, "--dump-dom", url, virtual_time_ms=10_000)
    assert result.returncode == 0, result.stderr[-2000:]
    body = Body()
    body.feed(result.stdout)
    return body.attributes


def test_a_page_on_another_origin_cannot_write_and_the_built_in_page_still_works(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    with ServiceProcess(tmp_path / "capwatch.db", python=INSTALLED_PYTHON, cwd=tmp_path) as service:  # as installed
        report = SimulatedRank("foreign", 0, 1, cap=512).report(0, 0, [])
        report["sent_unix_s"] = report["interval"]["start_unix_s"] = report["interval"]["end_unix_s"] = \
            __import__("time").time()
        (site / "attack.html").write_text(ATTACK % {"target": json.dumps(f"{service.url}/v1/reports"),
                                                     "body": json.dumps(json.dumps(report))})
        port = free_port()
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
        foreign = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=foreign.serve_forever, daemon=True).start()
        try:
            attack = dump_dom(tmp_path, f"http://127.0.0.1:{port}/attack.html")
        finally:
            foreign.shutdown()
        results = attack.get("data-results", "")
        assert "cors:blocked" in results, results  # no CORS answer: the browser never sends it
        with urllib.request.urlopen(f"{service.url}/v1/clusters") as response:
            assert json.loads(response.read()) == []  # nothing the page sent was stored ...
        with urllib.request.urlopen(f"{service.url}/metrics") as response:
            metrics = response.read().decode()
        refused = [line for line in metrics.splitlines()
                   if line.startswith('capwatch_reports_rejected_total{reason="unauthorized"}')]
        assert refused and float(refused[0].split()[-1]) >= 2, refused  # ... though both no-cors posts arrived
        page = dump_dom(tmp_path, f"{service.url}/")
        assert page.get("data-ready") == "1", page  # the built-in page, under the service's CSP
