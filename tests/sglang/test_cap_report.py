"""Issue #32 items 4 and 5 on the real plugin path: SGLang's own DeepEP dispatcher classes in gloo ranks of the
released 0.5.19 and 0.5.23 (``deep_ep.Buffer`` the one stand-in), the plugin loaded by ``load_plugins()`` and started
by ``configure_scheduler_process``, reporting to a real ``capwatch serve``.

- applied: the scheduler inherits what the launcher recorded (``apply/applied.py``: capwatch applied 128 at revision
  7) with the variable holding it: its series, its reports, ``/advice`` and its start line say "applied by capwatch
  at start (revision 7)";
- below: the operator's 16 under the decode CUDA-graph batch SGLang resolves on these ranks (32 x 1 token per
  request), which SGLang never checks for DeepEP: one error line at start, the shortfall metric and the service's
  ``cap_below_decode_graph`` finding, before any big decode step."""

from __future__ import annotations

import urllib.error

import pytest
from capwatch.sglang_plugin.apply.applied import record_applied
from capwatch.backends.deepep import RULES as DEEPEP

from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_dispatcher import WORLD
from tests.sglang.test_deepep_plugin import MODEL, get_json, value, wait_for
from tests.support.ports import free_port_block
from tests.support.service import ServiceProcess

RELEASES = ["0.5.19", "0.5.23"]
DECODE_GRAPH_BATCH = 32  # SGLang's resolved decode CUDA-graph max batch for these CPU ranks (1 token per request)
APPLIED = "applied by capwatch at start (revision 7)"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service") / "capwatch.sqlite3").start(timeout_s=60)
    yield process
    process.stop()


def _run(tmp_path, service, release: str, cluster: str, cap: int, applied: bool):
    """Two DeepEP ranks with ``cap`` (recorded as capwatch's, revision 7, where ``applied``), in SGLang's default
    --deepep-mode auto (decode through the low-latency buffer, prefill to normal mode: the floor is the decode graph
    term): a few decode steps under the cap, then paused: scraped, the service asked, released. Returns (run,
    scraped, view, advice)."""
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": cluster, "CAPWATCH_METRICS_BASE_PORT": str(base_port),
           "CAPWATCH_SERVICE_URL": service.url, "CAPWATCH_REPORT_INTERVAL_S": "0.5", DEEPEP.cap_env_var: str(cap)}
    if applied:  # what the launcher leaves in the environment its schedulers inherit
        record_applied(DEEPEP.cap_env_var, cap, "capwatch", 7, "advice revision 7 for this deployment", environ=env)
    plan = {"plugins": True, "deepep_model": MODEL, "deepep_mode": "auto",
            "layers": [0, 1], "steps": [{"tokens": [3, 5]}, {"tokens": [2, 4]}, {"pause": True}]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.deepep_rank_program").start(plan)
    try:
        run.wait_ready("paused")
        scraped = {rank: run.metrics(rank) for rank in range(WORLD)}
        view = wait_for(lambda: _view_with_both_ranks(service, cluster))
        advice = get_json(f"{service.url}/v1/clusters/{cluster}/advice")
    finally:
        (run.run_dir / "resume").write_text("")
        (run.run_dir / "release").write_text("")
        run.wait_exit()
        run.kill()
    return run, scraped, view, advice


def _view_with_both_ranks(service, cluster: str) -> dict:
    try:
        view = get_json(f"{service.url}/v1/clusters/{cluster}")
    except urllib.error.HTTPError as error:  # 404 until the first report arrives (later under load): wait on
        assert error.code != 404, f"{cluster} not reported yet"
        raise
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1], view
    return view


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", RELEASES, ids=lambda release: f"sglang-{release}")
def test_a_cap_capwatch_applied_is_reported_with_its_revision_by_every_rank(tmp_path, service, release):
    cluster = f"applied-{release.replace('.', '-')}"
    run, scraped, view, advice = _run(tmp_path, service, release, cluster, 128, applied=True)
    for rank in range(WORLD):
        series = {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        assert value(scraped[rank], "moe_a2a_sglang_info", cap_source="capwatch", advice_revision=7, **series) == 1
        assert value(scraped[rank], "moe_a2a_cap_tokens", **series) == 128
        assert value(scraped[rank], "capwatch_sglang_plugin_cap_shortfall_tokens",
                     cap_variable=DEEPEP.cap_env_var) == 0  # 128 >= 32 x 1
        log = run.log(rank)
        assert f"(deepep backend, GPU {rank}); /metrics on " in log and f"; its cap: {APPLIED}" in log, log[-3000:]
        assert "at start:" not in log
    assert [finding["kind"] for finding in view["findings"]] == []
    assert (advice["cap_set_by"], advice["cap_advice_revision"], advice["cap_origin"]) == ("capwatch", 7, APPLIED)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", RELEASES, ids=lambda release: f"sglang-{release}")
def test_a_deepep_cap_below_the_decode_graph_batch_is_said_at_start(tmp_path, service, release):
    cluster = f"below-{release.replace('.', '-')}"
    run, scraped, view, advice = _run(tmp_path, service, release, cluster, 16, applied=False)
    line = (f"capwatch: at start: {DEEPEP.cap_env_var}=16: cap 16 is below the decode CUDA-graph batch "
            f"{DECODE_GRAPH_BATCH} x 1 token per request = {DECODE_GRAPH_BATCH} tokens, which SGLang does not check at "
            f"start: {DEEPEP.below_floor}; set {DEEPEP.cap_env_var}=128 or more")
    for rank in range(WORLD):
        log = run.log(rank)
        assert log.count(line) == 1, log[-3000:]
        assert f"; its cap: set by the operator ({DEEPEP.cap_env_var})" in log
        assert value(scraped[rank], "capwatch_sglang_plugin_cap_shortfall_tokens",
                     cap_variable=DEEPEP.cap_env_var) == DECODE_GRAPH_BATCH - 16
        assert value(scraped[rank], "moe_a2a_sglang_info", cap_source="operator", dispatcher="target",
                     ep_rank=rank, ep_group=cluster) == 1
    findings = {finding["kind"]: finding for finding in view["findings"]}
    assert findings["cap_below_decode_graph"]["ranks"] == [0, 1], view["findings"]
    assert advice["floor_cap"] == DECODE_GRAPH_BATCH and advice["cap_set_by"] == "operator"
