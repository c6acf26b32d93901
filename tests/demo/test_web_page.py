"""The built-in web page in real headless Chromium, against a real service holding real reports
from a real demo run (gloo ranks, reporters): the charts drew data and the advice shows. The service is
``capwatch serve`` as an operator runs it: the non-editable ``.venv-service`` install, started in a folder
outside the checkout."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from capwatch.demo.session import DEMO_ADVISOR_SETTINGS
from tests.demo.conftest import free_port_block, get_json, write_timed_trace
from tests.support.checkout import REPO_ROOT
from tests.support.chromium import PageElements, chromium, needs_chromium
from tests.support.launcher import run_capwatch
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, needs_service_venv

CLUSTER = "webpage"
CAP = 256

pytestmark = [needs_chromium, needs_service_venv]


def installed_service(folder) -> ServiceProcess:
    """``capwatch serve`` from .venv-service, its working folder ``folder`` (outside the checkout)."""
    return ServiceProcess(folder / "capwatch.db", env=DEMO_ADVISOR_SETTINGS, python=INSTALLED_PYTHON, cwd=folder)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The installed service's URL (this module's own, not the demo tests' editable one)."""
    with installed_service(tmp_path_factory.mktemp("installed-service")).start(timeout_s=60) as process:
        yield process.url


@pytest.fixture(scope="module")
def cluster_with_data(service, tmp_path_factory):
    """A chunked demo run whose peaks cross the cap: overflow events, a raise, a full history."""
    folder = tmp_path_factory.mktemp("webdata")
    counts = [[60 + (step * 37) % 150, 40 + (step * 53) % 120] for step in range(44)]
    for step in (12, 30):
        counts[step] = [300, 120]  # R = 300 > cap 256: chunked, counted
    trace = write_timed_trace(folder / "trace.jsonl", counts, seconds_per_step=0.25)
    result = run_capwatch("demo", "--json", "--trace", str(trace), "--cap", str(CAP), "--overflow-policy", "chunk",
                          "--service-url", service, "--cluster", CLUSTER, "--metrics-port", str(free_port_block(2)))
    assert result.returncode == 0, result.stderr
    return counts


def test_page_draws_the_real_data(service, cluster_with_data, tmp_path):
    advice = get_json(f"{service}/v1/clusters/{CLUSTER}/advice")
    assert advice["action"] == "raise" and advice["recommended_cap"] > 300
    dom = chromium(tmp_path, "--dump-dom", f"{service}/?cluster={CLUSTER}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = PageElements()
    page.feed(dom.stdout)

    body = page.body
    assert body.get("data-ready") == "1", body
    assert body["data-cluster"] == CLUSTER and body["data-action"] == "raise"
    assert body["data-recommended-cap"] == str(advice["recommended_cap"])
    assert int(body["data-ranks"]) == 2
    assert int(body["data-utilization-points"]) >= 2 * 10  # ~11 s of 0.5 s intervals from each rank
    assert int(body["data-distribution-samples"]) >= 8
    assert int(body["data-overflow-events"]) >= 2  # both over-cap steps, summed over ranks
    assert int(body["data-whatif-points"]) >= 5
    assert int(body["data-cap-marks"]) == 3

    drawn = {element["data-series"]: int(element["data-points"]) for element in page.series}
    assert drawn["rank 0"] >= 10 and drawn["rank 1"] >= 10  # one line per rank
    whatif = get_json(f"{service}/v1/clusters/{CLUSTER}/whatif?cap=256&cap=512")
    if any(row.get("predicted_overflow_windows_per_day") is not None for row in whatif):
        assert drawn["overflow windows / day"] >= 5 and drawn["overflow windows / day range"] >= 5
    else:
        assert drawn["overflow rate"] >= 5
    assert drawn["GiB / rank"] >= 5  # the what-if curve
    assert drawn["peak R per interval"] >= 3  # histogram bars with data
    assert drawn["overflow events"] >= 1
    bad_paths = [element["d"][:160] for element in page.series
                 if element["tag"] == "path" and not re.fullmatch(r"M[\d.,L-]+Z?", element["d"])]  # Z: a filled band
    assert not bad_paths, f"paths that are not plain polylines (NaN or undefined points?): {bad_paths}"

    env_line = page.text_by_id["env-line"]
    assert env_line == f"export SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK={advice['recommended_cap']}"
    # The badge carries the advice's own caveat: a raise on ~11 s of history is low confidence (said first).
    assert page.text_by_id["action"].strip() == "raise" + (" · low confidence" if advice["low_confidence"] else "")
    assert page.text_by_id["current-cap"] == str(CAP)
    assert page.text_by_id["recommended-cap"].replace(",", "") == str(advice["recommended_cap"])


def test_page_shows_each_ranks_own_line_and_names_the_hot_rank(service, cluster_with_data, tmp_path):
    """Rank 0 has the larger local batches (R = 300 came from it): the page names it, draws each rank's own
    local line and R as one group line. Ranks whose reports lack their local batch: the page says so."""
    history = get_json(f"{service}/v1/clusters/{CLUSTER}/history")
    points = [point for series in history["ranks"] for point in series["points"]]
    reported = any(point.get("max_local_tokens") is not None for point in points)
    dom = chromium(tmp_path, "--dump-dom", f"{service}/?cluster={CLUSTER}")
    page = PageElements()
    page.feed(dom.stdout)
    drawn = {element["data-series"]: int(element["data-points"]) for element in page.series}
    hot_rank = page.text_by_id.get("hot-rank", "")
    if reported:
        assert page.body["data-hot-rank"] == "0", hot_rank
        assert hot_rank.startswith("rank 0 drives the group's peak: its largest local batch in the chart's span is "
                                   "300 tokens")
        assert drawn["group R"] >= 3 and drawn["rank 0"] >= 10 and drawn["rank 1"] >= 10
    else:
        assert page.body["data-hot-rank"] == "" and "these ranks do not report their own local batch" in hot_rank
        assert "group R" not in drawn  # the ranks' shared R lines stand in, as before


def test_page_screenshot(service, cluster_with_data, tmp_path):
    """A screenshot a person can look at (kept under the test's tmp folder)."""
    shot = tmp_path / "capwatch-page.png"
    result = chromium(tmp_path, f"--screenshot={shot}", f"{service}/?cluster={CLUSTER}")
    assert result.returncode == 0, result.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a blank page is a few KB


def test_assets_are_served_from_the_package_only(service):
    for name, kind in (("app.js", "javascript"), ("charts.js", "javascript"), ("style.css", "css")):
        with urllib.request.urlopen(f"{service}/web/{name}") as response:  # the installed copy of the file
            assert kind in response.headers["Content-Type"]
            assert response.read().decode() == (REPO_ROOT / "service" / "web" / name).read_text()
    for name in ("../main.py", "index.html.bak", "%2e%2e%2fconfig.py"):
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"{service}/web/{name}")
        assert error.value.code == 404
    with urllib.request.urlopen(f"{service}/") as response:
        page = response.read().decode()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # no CDN


def test_page_on_an_empty_service_says_what_to_do(tmp_path):
    with installed_service(tmp_path) as empty:
        dom = chromium(tmp_path, "--dump-dom", f"{empty.url}/")
    page = PageElements()
    page.feed(dom.stdout)
    assert page.body.get("data-ready") == "1" and page.body.get("data-clusters") == "0", page.body
    assert "No cluster has reported yet" in page.text_by_id["message"]
