"""The plugin on SGLang's own FlashInfer MegaMoE code, 0.5.22 and 0.5.23 (``layers/moe/flashinfer_megamoe.py``: the
layer build, the cap's resolution, ``run_flashinfer_megamoe``) in gloo ranks, FlashInfer's ``moe_ep`` the stand-in
(``flashinfer_megamoe_standin.py``): loaded by ``load_plugins()``, started by ``configure_scheduler_process``.

The variable is 0, SGLang's default: the layers are built with the cap SGLang derives
(``cutedsl_moe_max_num_tokens()``, here the prefill tokens), and that resolved cap is the one counted, reported
(as SGLang's default, not the operator's 0) and advised. While the ranks are alive their /metrics say what the
layers ran (each rank's own batch against the cap, the pairs sent, the pooled workspace's bytes once per process)
and the service advises the backend's own variable; then one rank's batch above the cap is counted and its final
report reaches the service before FlashInfer's ``MoEEpConfigError`` ends that rank."""

from __future__ import annotations

import pytest
import torch
from capwatch.backends.flashinfer_megamoe import RULES as MEGAMOE

from tests.sglang.flashinfer_megamoe_standin import OVERFLOW_TEXT
from tests.sglang.plugin_run import plugin_env, scrape_at_pause_then_overflow
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_plugin import service  # noqa: F401  (the service the ranks report to)
from tests.sglang.test_deepep_plugin import _final_rank_zero, value, wait_for
from tests.sglang.test_deepep_v2_plugin import _view
from tests.support.ports import free_port_block

WORLD = 2
CAP = 64  # what SGLang derives: the prefill tokens (max_prefill_tokens), above the decode graph's 16
MODEL = {"hidden_size": 256, "top_k": 2, "num_experts": 8, "intermediate_size": 128}
LAYERS = [3, 1]
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}, {"tokens": [0, 7]}]
BATCHES = {0: [3, CAP, 0], 1: [5, 1, 7]}
OVERFLOW = {"tokens": [CAP + 1, 3]}


def check_outputs(run: RankRun) -> int:
    """Every forward gave back what FlashInfer's layer computed (the counted forward passes it through)."""
    steps = 0
    for rank in range(WORLD):
        for done in run.record(rank)["steps"]:
            expected = (done["x"].float() * done["weights"].sum(1, keepdim=True)).to(torch.bfloat16)
            torch.testing.assert_close(done["output"], expected)
            steps += 1
    return steps // WORLD


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"], ids=lambda release: f"sglang-{release}")
def test_the_derived_cap_counted_reported_advised_then_the_overflow_reported_before_flashinfers_error(
        tmp_path, service, release):
    cluster = f"flashinfer-megamoe-{release.replace('.', '-')}"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {MEGAMOE.cap_env_var: "0"})
    plan = {"megamoe_model": MODEL, "layers": LAYERS,
            "server_args": {"max_prefill_tokens": CAP, "chunked_prefill_size": CAP, "cuda_graph_max_bs_decode": 16},
            "steps": [*STEPS, {"pause": True}, OVERFLOW]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.flashinfer_megamoe_rank_program").start(plan)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view)

    assert check_outputs(run) == len(LAYERS) * len(STEPS)
    for rank in range(WORLD):
        log, record = run.log(rank), run.record(rank)
        assert f"capwatch: enabled on sglang {release} (flashinfer_megamoe backend, GPU {rank})" in log, log[-3000:]
        assert f"max_tokens_per_rank={CAP}: derived by SGLang ({MEGAMOE.cap_env_var} is 0)" in log, log[-3000:]
        assert record["caps"] == [CAP] * len(LAYERS)  # SGLang built every layer with the derived cap
        assert len(record["workspaces"]) == 1  # FlashInfer pools one workspace for the layers
        workspace_bytes = record["workspaces"][0]
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        steps = record["steps"]
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(steps)
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(BATCHES[rank])
        sampled = steps[::len(LAYERS)]
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sum(step["ids"].numel() for step in sampled)
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == workspace_bytes
        assert value(metrics, "moe_a2a_flashinfer_megamoe_buffer_bytes", **series) == workspace_bytes
        assert value(metrics, "moe_a2a_info", a2a_backend=MEGAMOE.name, backend="sglang-flashinfer_megamoe",
                     **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
        assert "capwatch: at start:" not in log  # the resolved (derived) cap is checked, not the 0: it meets the floor
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        (MEGAMOE.name, MEGAMOE.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == workspace_bytes
    assert advice["cap_set_by"] == "default", advice  # the operator's 0 is SGLang's default, derived

    assert code != 0
    assert f"{CAP + 1} {OVERFLOW_TEXT}{CAP}" in run.log(0), run.log(0)[-3000:]  # FlashInfer's MoEEpConfigError
    assert f"{MEGAMOE.cap_env_var}=128" in run.log(0)  # capwatch's line before FlashInfer's error
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
