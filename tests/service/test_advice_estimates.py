"""The advice says when its price is an estimate, through the real ``capwatch serve`` (the installed product): a
reported-bytes backend's buffer (Mooncake EP, NIXL EP, DeepEP v2: ``backends/reported.py``) is exact only at the cap
its ranks reported it for, so a change of cap priced in proportion says so — in ``/advice``'s fields, its reasons,
``capwatch advise`` and the page — while an exactly sized backend (DeepEP's buffer) and the reported cap itself say
exact."""

from __future__ import annotations

import json
import random
import time
import urllib.request

import pytest
from capwatch.backends import SPECS
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.backends.reported import ReportedBuffer
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import model_geometry
from capwatch.telemetry.rank import rank_config
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import RankReporter, ReporterOptions, new_boot_id

from tests.support.chromium import evaluate_on_page, needs_chromium
from tests.support.launcher import run_capwatch
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, needs_service_venv

pytestmark = needs_service_venv

REPORTED = [name for name, spec in SPECS.items() if spec.bytes_known == "reported"]
EP_SIZE = 2
CAP = 512
BUFFER_BYTES = 3 << 30  # what each rank's buffer reported at CAP
GEOMETRY = model_geometry("deepseek-v3")


def _get(url: str):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


def _config(backend: str, cap: int):
    shared = dict(cap=cap, ep_size=EP_SIZE, hidden_size=GEOMETRY.hidden_size, top_k=GEOMETRY.top_k,
                  num_experts=GEOMETRY.num_experts, backend=f"sglang-{backend}", a2a_backend=backend)
    if backend == DEEPEP.name:
        plan = plan_deepep_buffer(GEOMETRY, EP_SIZE, cap, "auto")
        return rank_config(**shared, deepep=DeepEPBuffer(mode="auto", buffer_experts=plan.buffer_experts,
                                                         normal_nvl_bytes=plan.normal_nvl_bytes,
                                                         normal_rdma_bytes=plan.normal_rdma_bytes),
                           allocated_workspace_bytes=plan.buffer_bytes_per_rank)
    return rank_config(**shared, **{backend: ReportedBuffer(buffer_bytes=BUFFER_BYTES)},
                       allocated_workspace_bytes=BUFFER_BYTES)


# cluster -> (backend, cap, the local batches its ranks run): quiet groups are advised lower; "-steady" runs near
# its cap and holds, priced at the reported cap itself.
GROUPS = {**{f"{name}-quiet": (name, CAP, (20, 90)) for name in REPORTED},
          "mooncake-steady": ("mooncake", 256, (150, 200)), "deepep-quiet": (DEEPEP.name, CAP, (20, 90))}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    env = {"CAPWATCH_WINDOW_S": "1", "CAPWATCH_ADVISOR__MIN_SAMPLES": "3", "CAPWATCH_ADVISOR__MIN_HISTORY_S": "2",
           "CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S": "2"}
    folder = tmp_path_factory.mktemp("estimates")
    service = ServiceProcess(folder / "capwatch.db", env=env, python=INSTALLED_PYTHON, cwd=folder).start(timeout_s=120)
    ranks = []
    for cluster, (backend, cap, _) in GROUPS.items():
        for rank in range(EP_SIZE):
            counters = DispatchCounters(cap, EP_SIZE)
            identity = RankIdentity(cluster=cluster, ep_rank=rank, ep_size=EP_SIZE, boot_id=new_boot_id())
            reporter = RankReporter(counters, identity, _config(backend, cap),
                                    ReporterOptions(service.url, interval_s=0.25)).start()
            ranks.append((cluster, counters, reporter))
    generator = random.Random(7)
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        for cluster, counters, _ in ranks:
            local = generator.randint(*GROUPS[cluster][2])
            counters.record_step(local, local)
        time.sleep(0.01)
    for _, _, reporter in ranks:
        assert reporter.close("done", timeout_s=10)
    yield service
    service.stop()


@pytest.mark.parametrize("name", REPORTED)
def test_a_change_priced_in_proportion_is_marked_an_estimate(service, name):
    advice = _get(f"{service.url}/v1/clusters/{name}-quiet/advice")
    assert advice["a2a_backend"] == name and advice["action"] == "lower", advice
    recommended = advice["recommended_cap"]
    assert recommended < CAP
    # the fields it always had, with their meaning: the bytes at the recommended cap, in proportion to the report
    assert advice["workspace_bytes_per_rank_current"] == BUFFER_BYTES
    assert advice["workspace_bytes_per_rank_recommended"] == -(-BUFFER_BYTES * recommended // CAP)
    # and now what they are: exact at the reported cap, an estimate at the recommended one
    assert advice["workspace_bytes_exact_current"] is True
    assert advice["workspace_bytes_exact_recommended"] is False
    assert advice["workspace_bytes_reported_cap"] == CAP
    basis = advice["workspace_bytes_basis"]
    assert basis == f"estimated in proportion to the 3.00 GiB per rank reported at cap {CAP}, exact only there"
    change = [reason for reason in advice["reasons"] if reason.startswith(f"lowering {CAP} -> {recommended}")]
    assert len(change) == 1 and basis in change[0], advice["reasons"]
    rows = _get(f"{service.url}/v1/clusters/{name}-quiet/whatif?cap=128&cap={CAP}")
    assert [row["workspace_bytes_exact"] for row in rows] == [False, True]


def test_the_reported_cap_itself_is_priced_exact(service):
    advice = _get(f"{service.url}/v1/clusters/mooncake-steady/advice")
    assert (advice["action"], advice["recommended_cap"]) == ("hold", 256), advice
    assert advice["workspace_bytes_per_rank_recommended"] == BUFFER_BYTES
    assert (advice["workspace_bytes_exact_current"], advice["workspace_bytes_exact_recommended"]) == (True, True)
    assert (advice["workspace_bytes_basis"], advice["workspace_bytes_reported_cap"]) == ("exact", None)
    assert not any("estimated" in reason for reason in advice["reasons"])


def test_an_exactly_sized_backend_is_marked_exact_at_any_cap(service):
    advice = _get(f"{service.url}/v1/clusters/deepep-quiet/advice")
    assert advice["a2a_backend"] == DEEPEP.name and advice["action"] == "lower", advice
    assert advice["workspace_bytes_per_rank_recommended"] == plan_deepep_buffer(
        GEOMETRY, EP_SIZE, advice["recommended_cap"], "auto").buffer_bytes_per_rank
    assert (advice["workspace_bytes_exact_current"], advice["workspace_bytes_exact_recommended"]) == (True, True)
    assert (advice["workspace_bytes_basis"], advice["workspace_bytes_reported_cap"]) == ("exact", None)
    assert not any("estimated" in reason for reason in advice["reasons"])


def test_capwatch_advise_says_which_price_is_an_estimate(service):
    result = run_capwatch("advise", "--url", service.url, "--cluster", "mooncake-quiet", timeout_s=120)
    assert result.returncode == 0, result.stderr
    card = result.stdout
    assert "\u2248 " in card and f"estimate from cap {CAP}'s report" in card, card
    assert "estimated in proportion to the 3.00 GiB per rank reported at cap 512" in card  # the reasons
    exact = run_capwatch("advise", "--url", service.url, "--cluster", "deepep-quiet", timeout_s=120)
    assert exact.returncode == 0, exact.stderr
    card = "\n".join(line for line in exact.stdout.splitlines() if line.startswith("\u2502"))
    assert "\u2248" not in card and "estimate" not in exact.stdout, exact.stdout
    assert any("workspace priced" in line and "exact" in line for line in exact.stdout.splitlines()), exact.stdout


def test_capwatch_advise_whatif_marks_the_estimated_rows(service):
    result = run_capwatch("advise", "--url", service.url, "--cluster", "mooncake-quiet", "--whatif", "128", str(CAP),
                          timeout_s=120)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("\u2502 ")
            and line.split()[1].isdigit()}
    assert rows["128"].startswith("\u2502 128 \u2248") and "\u2248" not in rows[str(CAP)], result.stdout
    assert "\u2248 after a cap: its workspace, group change and KV tokens are estimates" in result.stdout


FACTS = """[...document.querySelectorAll("#advice-facts div")].map((d) => [d.children[0].textContent,
  d.children[1].textContent])"""


@needs_chromium
def test_the_page_marks_the_estimate(service, tmp_path):
    facts = dict(evaluate_on_page(tmp_path, f"{service.url}/?cluster=mooncake-quiet", FACTS))
    assert facts["workspace priced"].startswith(f"estimated in proportion to the 3.00 GiB per rank reported at cap {CAP}")
    assert facts["workspace / rank after"].startswith("\u2248 ") and not facts["workspace / rank now"].startswith("\u2248")
    assert facts["change across group"].startswith("\u2248 ")
    exact = dict(evaluate_on_page(tmp_path, f"{service.url}/?cluster=deepep-quiet", FACTS))
    assert exact["workspace priced"] == "exact" and not exact["workspace / rank after"].startswith("\u2248")


CURVES = """[...document.querySelectorAll("#chart-whatif [data-series]")].map((e) => e.getAttribute("data-series"))"""


@needs_chromium
def test_the_pages_whatif_curve_says_it_is_estimated(service, tmp_path):
    assert "GiB / rank (\u2248 estimated)" in evaluate_on_page(tmp_path, f"{service.url}/?cluster=mooncake-quiet", CURVES)
    exact = evaluate_on_page(tmp_path, f"{service.url}/?cluster=deepep-quiet", CURVES)
    assert "GiB / rank" in exact and not any("estimated" in name for name in exact), exact
