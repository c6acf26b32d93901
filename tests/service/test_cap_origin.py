"""Issue #32 items 4 and 5 through the real ``capwatch serve`` (the installed product): ranks say who set the cap their
dispatcher was built with (capwatch at start with the advice revision, the operator, SGLang's default); ``/advice``,
``capwatch advise`` and the page say "applied by capwatch at start (revision N)"; a group whose ranks disagree on who
set it or on the revision is a finding, as is a DeepEP low-latency cap below the decode CUDA-graph batch x tokens per
request, which SGLang never checks at start."""

from __future__ import annotations

import json
import urllib.request

import pytest
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import model_geometry
from capwatch.telemetry.rank import rank_config
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import RankReporter, ReporterOptions, new_boot_id

from tests.support.chromium import PageElements, chromium, needs_chromium
from tests.support.launcher import run_capwatch
from tests.support.service import INSTALLED_PYTHON, ServiceProcess, needs_service_venv

pytestmark = needs_service_venv

GEOMETRY = model_geometry("deepseek-v3")
EP_SIZE = 4
# The decode graph batch x tokens per request SGLang captures: 96 x 2 = 192 tokens per rank.
LIMITS = SGLangLimits(sglang_version="0.5.23", disaggregation_mode="decode", decode_cuda_graph_max_batch_size=96,
                      tokens_per_request=2)
APPLIED = "applied by capwatch at start (revision 7)"


def _get(url: str):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read()) if response.headers.get_content_type() == "application/json" \
            else response.read().decode()


def _report(service, cluster: str, cap: int, origins: list[tuple[str, int | None]]) -> None:
    """One DeepEP rank per origin (cap_source, advice_revision) reports one decode step of 100 tokens."""
    plan = plan_deepep_buffer(GEOMETRY, len(origins), cap, "auto")
    buffer = DeepEPBuffer(mode="auto", buffer_experts=plan.buffer_experts, normal_nvl_bytes=plan.normal_nvl_bytes,
                          normal_rdma_bytes=plan.normal_rdma_bytes)
    for rank, (source, revision) in enumerate(origins):
        limits = LIMITS.model_copy(update={"cap_source": source, "advice_revision": revision})
        config = rank_config(cap=cap, ep_size=len(origins), hidden_size=GEOMETRY.hidden_size, top_k=GEOMETRY.top_k,
                             num_experts=GEOMETRY.num_experts, backend="sglang-deepep", a2a_backend=DEEPEP.name,
                             deepep=buffer, allocated_workspace_bytes=plan.buffer_bytes_per_rank, sglang=limits)
        counters = DispatchCounters(cap, len(origins))
        identity = RankIdentity(cluster=cluster, ep_rank=rank, ep_size=len(origins), boot_id=new_boot_id())
        reporter = RankReporter(counters, identity, config, ReporterOptions(service.url, interval_s=None))
        counters.record_step(100, 100)
        assert reporter.close("done", timeout_s=10)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("origin")
    service = ServiceProcess(folder / "capwatch.db", python=INSTALLED_PYTHON, cwd=folder).start(timeout_s=120)
    _report(service, "applied", 1024, [("capwatch", 7)] * EP_SIZE)
    _report(service, "split", 1024, [("capwatch", 7), ("capwatch", 7), ("capwatch", 6), ("operator", None)])
    _report(service, "below", 128, [("default", None)] * 2)
    _report(service, "legacy", 1024, [("env", None)] * 2)  # ranks older than apply: "env", the operator's
    yield service
    service.stop()


def _findings(service, cluster: str) -> dict:
    return {finding["kind"]: finding for finding in _get(f"{service.url}/v1/clusters/{cluster}")["findings"]}


def test_a_group_capwatch_started_says_so_with_its_revision(service):
    advice = _get(f"{service.url}/v1/clusters/applied/advice")
    assert (advice["cap_set_by"], advice["cap_advice_revision"], advice["cap_origin"]) == ("capwatch", 7, APPLIED)
    assert _findings(service, "applied") == {}


def test_capwatch_advise_says_who_set_the_cap(service):
    result = run_capwatch("advise", "--url", service.url, "--cluster", "applied", timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert _flat(APPLIED) in _flat(result.stdout), result.stdout
    result = run_capwatch("advise", "--url", service.url, "--cluster", "legacy", timeout_s=120)
    assert _flat(f"set by the operator ({DEEPEP.cap_env_var})") in _flat(result.stdout), result.stdout


def _flat(text: str) -> str:
    """The card's text without spaces and box lines: a value the card folds over lines reads whole."""
    return "".join(char for char in text if not char.isspace() and char not in "│┌┐└┘─┬┴┼├┤")


@needs_chromium
def test_the_page_says_who_set_the_cap(service, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", f"{service.url}/?cluster=applied")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = PageElements()
    page.feed(dom.stdout)
    assert page.body.get("data-ready") == "1" and page.body["data-cluster"] == "applied", page.body
    assert APPLIED in dom.stdout


def test_ranks_that_disagree_on_who_set_the_cap_or_the_revision_are_a_finding(service):
    finding = _findings(service, "split")["cap_source_mismatch"]
    assert finding["ranks"] == [2, 3] and finding["severity"] == "warning", finding
    assert "revision 6" in finding["message"] and f"set by the operator ({DEEPEP.cap_env_var})" in finding["message"]
    assert "cap_mismatch" not in _findings(service, "split")  # the same cap: only who set it differs
    advice = _get(f"{service.url}/v1/clusters/split/advice")
    assert advice["cap_set_by"] == "mixed" and advice["cap_advice_revision"] is None
    assert "disagree" in advice["cap_origin"]
    metrics = _get(f"{service.url}/metrics")
    assert 'capwatch_consistency_findings{dispatcher="target",ep_group="split",finding="cap_source_mismatch"} 2.0' \
        in metrics


def test_a_deepep_cap_below_the_decode_graph_batch_is_a_finding(service):
    finding = _findings(service, "below")["cap_below_decode_graph"]
    assert finding["ranks"] == [0, 1], finding
    # 128 < 96 x 2 = 192: DeepEP's assertion would end the rank at capture; the fix is 192 rounded up to 128's.
    assert "cap 128 is below the verify CUDA-graph batch 96 x 2 tokens per request = 192" in finding["message"]
    assert f"{DEEPEP.cap_env_var}=256 or more" in finding["message"]
    assert "cap_below_decode_graph" not in _findings(service, "applied")  # 1024 >= 192
    metrics = _get(f"{service.url}/metrics")
    assert 'capwatch_consistency_findings{dispatcher="target",ep_group="below",finding="cap_below_decode_graph"} 2.0' \
        in metrics
    advice = _get(f"{service.url}/v1/clusters/below/advice")
    assert advice["cap_origin"] == f"SGLang's default ({DEEPEP.cap_env_var} unset)"
