"""The plugin on SGLang 0.5.22's and 0.5.23's own ``DeepEPv2Dispatcher`` in gloo ranks (``deep_ep.ElasticBuffer`` the
one stand-in, ``deepep_v2_standin.py``): loaded by ``load_plugins()``, started by ``configure_scheduler_process``.
While the ranks are alive their /metrics say what they dispatched (each rank's own batch against the cap, the pairs
sent, the ElasticBuffer's bytes once per process) and the service advises DeepEP v2's own variable from their reports,
priced from those bytes; then one rank's batch above the cap is counted and its final report reaches the service
before SGLang's ``ValueError`` ends that rank."""

from __future__ import annotations

import urllib.error

import pytest
import torch
from capwatch.backends.deepep_v2 import RULES as DEEPEP_V2

from tests.sglang.deepep_v2_standin import standin_num_bytes
from tests.sglang.plugin_run import plugin_env, scrape_at_pause_then_overflow
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_plugin import service  # noqa: F401  (the service the ranks report to)
from tests.sglang.test_deepep_plugin import _final_rank_zero, get_json, value, wait_for
from tests.support.ports import free_port_block

WORLD = 2
CAP = 64
MODEL = {"hidden_size": 256, "top_k": 2, "num_experts": 8}  # a multiple of DeepEP v2's 128-channel blocks
LAYERS = [3, 1]  # built out of order: layer 1 leads
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1], "extend": True}, {"tokens": [0, 7]}]
BATCHES = {0: [3, CAP, 0], 1: [5, 1, 7]}
OVERFLOW = {"tokens": [CAP + 1, 3]}  # rank 0 alone: SGLang refuses it there
SGLANG_REFUSAL = f"DeepEP v2 dispatch input exceeds the per-rank buffer capacity {CAP}, got {CAP + 1}"


def check_steps(run: RankRun) -> int:
    """Every combine gives back 2 x each token times its routing weights' sum: SGLang's dispatcher runs as
    without capwatch."""
    steps = 0
    for rank in range(WORLD):
        for done in run.record(rank)["steps"]:
            expected = done["x"].float() * 2 * done["weights"].sum(1, keepdim=True)
            torch.testing.assert_close(done["combined"].float(), expected, atol=0.05, rtol=0.02)
            steps += 1
    return steps


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"], ids=lambda release: f"sglang-{release}")
def test_counted_reported_advised_then_the_overflow_reported_before_sglangs_value_error(tmp_path, release, service):
    cluster = f"deepep-v2-{release.replace('.', '-')}"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {DEEPEP_V2.cap_env_var: str(CAP)})
    plan = {"deepep_model": MODEL, "layers": LAYERS,
            "server_args": {"chunked_prefill_size": CAP * WORLD, "cuda_graph_max_bs_decode": 16},
            "steps": [*STEPS, {"pause": True}, OVERFLOW]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.deepep_v2_rank_program").start(plan)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view)

    assert check_steps(run) == WORLD * len(LAYERS) * len(STEPS)
    buffer_bytes = standin_num_bytes(CAP, MODEL["hidden_size"], MODEL["top_k"], WORLD)
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {release} (deepep_v2 backend, GPU {rank})" in log, log[-3000:]
        assert run.record(rank)["buffers"] == [(buffer_bytes, CAP)]  # one ElasticBuffer a process
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        steps = run.record(rank)["steps"]
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(steps)
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(BATCHES[rank])
        sampled = steps[::len(LAYERS)]  # the leading layer's dispatches
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sum(step["ids"].numel() for step in sampled)
        assert value(metrics, "moe_a2a_cap_tokens", **series) == CAP
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_workspace_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_deepep_v2_buffer_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_info", a2a_backend="deepep_v2", backend="sglang-deepep_v2", **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        (DEEPEP_V2.name, DEEPEP_V2.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == buffer_bytes
    # SGLang's own floor, read by its functions: the prefill budget (the chunk scattered over the TP ranks)
    assert advice["floor_cap"] == CAP, advice

    assert code != 0
    assert SGLANG_REFUSAL in run.log(0), run.log(0)[-3000:]
    assert f"{DEEPEP_V2.cap_env_var}=128" in run.log(0)  # capwatch's line before SGLang's ValueError
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
    assert final["forward_steps_total"] == len(BATCHES[0]) + 1  # the refused batch is in the histogram too


@pytest.mark.timeout(600)
def test_an_older_release_is_refused_in_one_line_and_sglang_runs_on(tmp_path):
    """0.5.21 checks DeepEP v2's cap at start by a rule capwatch's floor does not read: the plugin says so in one
    line, serves its info metric disabled and hooks nothing (no dispatcher is built: the start is what is checked)."""
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": "deepep-v2-0-5-21",
           "CAPWATCH_METRICS_BASE_PORT": str(base_port), DEEPEP_V2.cap_env_var: str(CAP)}
    # 0.5.21's prefill budget is the whole chunk (0.5.22 on: scattered over the TP ranks): within its cap here.
    plan = {"deepep_model": MODEL, "layers": [],
            "server_args": {"chunked_prefill_size": CAP, "cuda_graph_max_bs_decode": 16}, "steps": []}
    run = RankRun(tmp_path, WORLD, env, sglang_release="0.5.21", metrics_base_port=base_port,
                  program="tests.sglang.deepep_v2_rank_program").start(plan)
    try:
        run.wait_ready()
        scraped = run.metrics(0)
        assert run.release() == [0] * WORLD
    finally:
        run.kill()
    for rank in range(WORLD):
        lines = [line for line in run.log(rank).splitlines() if "capwatch:" in line]
        assert len(lines) == 1, lines
        assert ("capwatch: disabled: capwatch's deepep_v2 hooks are verified on sglang 0.5.22, 0.5.23, not 0.5.21: "
                "its start-up check of the cap is another rule") in lines[0], lines
    info = [labels for (name, labels), v in scraped.items() if name == "capwatch_sglang_plugin_info" and v == 1]
    assert info and all(dict(labels)["state"] == "disabled" for labels in info), scraped
    assert not any(name.startswith("moe_a2a_") for name, _ in scraped), scraped


def _view(service, cluster: str) -> dict:
    """The group's view once both ranks have reported (a 404 until the first report arrives)."""
    try:
        view = get_json(f"{service.url}/v1/clusters/{cluster}")
    except urllib.error.HTTPError as error:
        raise AssertionError(f"no view of {cluster} yet: {error}") from None
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1], view
    assert view["group_max_runtime_tokens"] == CAP, view
    return view
