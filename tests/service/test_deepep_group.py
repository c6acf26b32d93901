"""A DeepEP EP group through the real ``capwatch serve``: four ranks report their low-latency dispatches (each
rank's own batch against the cap, as DeepEP checks it) with their buffer, and the service's view, advice,
metrics and ``capwatch advise`` speak of DeepEP's variable and buffer, within DeepEP's rules."""

from __future__ import annotations

import json
import random
import time
import urllib.request

import pytest
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import model_geometry
from capwatch.telemetry.rank import rank_config
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import RankReporter, ReporterOptions, new_boot_id

from tests.support.chromium import PageElements, chromium, needs_chromium
from tests.support.launcher import run_capwatch
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, needs_service_venv

pytestmark = needs_service_venv

CLUSTER = "deepep-decode"
EP_SIZE = 4
CAP = 1024
GEOMETRY = model_geometry("deepseek-v3")
# The decode graph batch x tokens per request SGLang captures: 96 x 2 = 192 tokens per rank.
LIMITS = SGLangLimits(sglang_version="0.5.23", disaggregation_mode="decode", decode_cuda_graph_max_batch_size=96,
                      tokens_per_request=2)


def _get(url: str):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read()) if response.headers.get_content_type() == "application/json" \
            else response.read().decode()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    env = {"CAPWATCH_WINDOW_S": "1", "CAPWATCH_ADVISOR__MIN_SAMPLES": "3", "CAPWATCH_ADVISOR__MIN_HISTORY_S": "2",
           "CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S": "2"}
    # The installed product, started outside the checkout, as the page tests run it (the page is one of the views).
    folder = tmp_path_factory.mktemp("deepep")
    service = ServiceProcess(folder / "capwatch.db", env=env, python=INSTALLED_PYTHON, cwd=folder).start(timeout_s=120)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def reported(service):
    """Four DeepEP ranks (auto mode, DeepSeek-V3 over 4 ranks) report 6 s of decode steps whose local batches
    peak at 250 tokens, well under their cap of 1024."""
    plan = plan_deepep_buffer(GEOMETRY, EP_SIZE, CAP, "auto")
    buffer = DeepEPBuffer(mode="auto", buffer_experts=plan.buffer_experts, normal_nvl_bytes=plan.normal_nvl_bytes,
                          normal_rdma_bytes=plan.normal_rdma_bytes)
    config = rank_config(cap=CAP, ep_size=EP_SIZE, hidden_size=GEOMETRY.hidden_size, top_k=GEOMETRY.top_k,
                         num_experts=GEOMETRY.num_experts, backend="sglang-deepep", a2a_backend=DEEPEP.name,
                         deepep=buffer, allocated_workspace_bytes=plan.buffer_bytes_per_rank, sglang=LIMITS)
    ranks = []
    for rank in range(EP_SIZE):
        counters = DispatchCounters(CAP, EP_SIZE)
        identity = RankIdentity(cluster=CLUSTER, ep_rank=rank, ep_size=EP_SIZE, boot_id=new_boot_id())
        reporter = RankReporter(counters, identity, config, ReporterOptions(service.url, interval_s=0.25)).start()
        ranks.append((counters, reporter))
    generator = random.Random(19)
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        for counters, _ in ranks:
            local = generator.randint(120, 250)  # DeepEP: each rank's own batch is what meets the cap
            counters.record_step(local, local)
        time.sleep(0.01)
    for _, reporter in ranks:
        assert reporter.close("done", timeout_s=10)
    return plan


def test_the_view_prices_deepeps_buffer_and_finds_nothing_amiss(service, reported):
    view = _get(f"{service.url}/v1/clusters/{CLUSTER}")
    assert view["cap"] == CAP and view["ep_size"] == EP_SIZE
    assert view["workspace_bytes_per_rank"] == reported.buffer_bytes_per_rank
    assert all(rank["expected_workspace_bytes_per_rank"] == rank["workspace_bytes_per_rank"]
               == reported.buffer_bytes_per_rank for rank in view["ranks"])
    assert [finding["kind"] for finding in view["findings"]] == []


def test_the_advice_is_deepeps_variable_within_its_rules(service, reported):
    advice = _get(f"{service.url}/v1/clusters/{CLUSTER}/advice")
    assert (advice["a2a_backend"], advice["cap_variable"]) == (DEEPEP.name, DEEPEP.cap_env_var)
    assert advice["action"] == "lower" and advice["recommended_cap"] % 128 == 0
    assert 192 <= advice["recommended_cap"] < CAP  # the decode graph floor, 96 x 2, and the peaks under it
    assert advice["env"] == f"{DEEPEP.cap_env_var}={advice['recommended_cap']}"
    assert advice["workspace_bytes_per_rank_recommended"] == plan_deepep_buffer(
        GEOMETRY, EP_SIZE, advice["recommended_cap"], "auto").buffer_bytes_per_rank
    assert advice["kv_cache_tokens_per_rank_freed"] > 0
    rows = _get(f"{service.url}/v1/clusters/{CLUSTER}/whatif?cap=128&cap=1024")
    assert [row["workspace_bytes_per_rank"] for row in rows] == [
        plan_deepep_buffer(GEOMETRY, EP_SIZE, cap, "auto").buffer_bytes_per_rank for cap in (128, 1024)]
    assert [row["below_floor"] for row in rows] == [True, False]


def test_capwatch_advise_prints_deepeps_export_line(service, reported):
    result = run_capwatch("advise", "--url", service.url, "--cluster", CLUSTER, timeout_s=120)
    assert result.returncode == 0, result.stderr
    export = [line for line in result.stdout.splitlines() if line.startswith("export ")]
    assert len(export) == 1 and export[0].startswith(f"export {DEEPEP.cap_env_var}=")
    assert "deepep" in result.stdout


@needs_chromium
def test_the_page_shows_deepeps_variable(service, reported, tmp_path):
    """The built-in page in real headless Chromium: the group's cap is DeepEP's, and the line to export sets it."""
    advice = _get(f"{service.url}/v1/clusters/{CLUSTER}/advice")
    dom = chromium(tmp_path, "--dump-dom", f"{service.url}/?cluster={CLUSTER}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = PageElements()
    page.feed(dom.stdout)
    assert page.body.get("data-ready") == "1" and page.body["data-cluster"] == CLUSTER, page.body
    assert DEEPEP.cap_env_var in dom.stdout  # the facts' "cap variable"
    assert "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK" not in dom.stdout
    if advice["env"] is not None:
        assert page.text_by_id["env-line"] == f"export {DEEPEP.cap_env_var}={advice['recommended_cap']}"


def test_a_whatif_cap_outside_deepeps_range_is_a_422(service, reported):
    """Issue #36 (F23): /whatif checked a DeepEP group's caps against FlashInfer's range and answered 409 for
    1,025 - 1,048,576: a question outside the group's backend range is a bad request, said as such."""
    import urllib.error

    for cap in (1025, 1_048_576):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(f"{service.url}/v1/clusters/{CLUSTER}/whatif?cap=128&cap={cap}")
        assert refused.value.code == 422
        assert f"cap {cap} is outside 1..1024" in refused.value.read().decode()


def test_a_group_mixing_deepep_and_flashinfer_ranks_is_found_and_not_advised(service, reported):
    """Issue #36 (symptom 9): a group mixing DeepEP and FlashInfer ranks had no finding naming the mismatch and was
    advised by FlashInfer's rules."""
    import urllib.error

    from tests.support.simulate import SimulatedRank

    mixed = "mixed-backends"
    plan = plan_deepep_buffer(GEOMETRY, 2, 512, "auto")
    deepep = rank_config(cap=512, ep_size=2, hidden_size=GEOMETRY.hidden_size, top_k=GEOMETRY.top_k,
                         num_experts=GEOMETRY.num_experts, backend="sglang-deepep", a2a_backend=DEEPEP.name,
                         deepep=DeepEPBuffer(mode="auto", buffer_experts=plan.buffer_experts,
                                             normal_nvl_bytes=plan.normal_nvl_bytes,
                                             normal_rdma_bytes=plan.normal_rdma_bytes))
    counters = DispatchCounters(512, 2)
    reporter = RankReporter(counters, RankIdentity(cluster=mixed, ep_rank=0, ep_size=2, boot_id=new_boot_id()),
                            deepep, ReporterOptions(service.url, interval_s=None))
    counters.record_step(100, 100)
    assert reporter.close("done", timeout_s=10)
    flashinfer = SimulatedRank(mixed, 1, 2, cap=512)
    now = time.time()
    request = urllib.request.Request(f"{service.url}/v1/reports", method="POST",
                                     data=json.dumps(flashinfer.report(now - 5, now, [100])).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).close()

    findings = {finding["kind"]: finding for finding in _get(f"{service.url}/v1/clusters/{mixed}")["findings"]}
    assert findings["backend_mismatch"]["severity"] == "critical"
    assert "deepep" in findings["backend_mismatch"]["message"] and "flashinfer" in findings["backend_mismatch"]["message"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(f"{service.url}/v1/clusters/{mixed}/advice")
    assert refused.value.code == 409 and "different A2A backends" in refused.value.read().decode()
