"""The plugin on SGLang's own pplx dispatcher classes in gloo ranks, on 0.5.19 (capwatch's decode-graph term), 0.5.22
(SGLang's) and 0.5.23 (``pplx_kernels`` the one stand-in, ``pplx_standin.py``): loaded by ``load_plugins()``, started
by ``configure_scheduler_process``. While the ranks are alive their /metrics say what they dispatched (each rank's
own batch against the cap, the pairs sent, the AllToAll's bytes as capwatch prices pplx-kernels' allocations for the
arguments SGLang built it with, once per process), their reports carry SGLang's own floor
(``required_pplx_dispatch_tokens_per_rank``) and the service advises pplx's own variable; then one rank's batch
above the cap is counted, logged with the line to set and its final report reaches the service before SGLang's
assertion (naming the variable) ends that rank."""

from __future__ import annotations

import pytest
from capwatch.backends import spec_of

from tests.sglang.plugin_run import plugin_env, scrape_at_pause_then_overflow
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_dispatcher import check_steps
from tests.sglang.test_deepep_plugin import service  # noqa: F401  (the service the ranks report to)
from tests.sglang.test_deepep_plugin import _final_rank_zero, value, wait_for
from tests.sglang.test_deepep_v2_plugin import _view
from tests.support.ports import free_port_block

PPLX = spec_of("pplx").rules
WORLD = 2
CAP = 64
MODEL = {"hidden_size": 2048, "top_k": 2, "num_experts": 8}  # as the DeepEP tests (check_steps reads it)
LAYERS = [3, 1]
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}, {"tokens": [0, 7]}]
BATCHES = {0: [3, CAP, 0], 1: [5, 1, 7]}
OVERFLOW = {"tokens": [CAP + 1, 3]}
# SGLang's assertion in _PplxDispatcherImpl.dispatch_a (token_dispatcher/pplx.py:291-295), as the rank logs it.
SGLANG_ASSERT = (f"AssertionError: num_tokens ({CAP + 1}) exceeds num_max_dispatch_tokens_per_rank ({CAP}); raise "
                 f"{PPLX.cap_env_var}")


def all_to_all_bytes(cap: int) -> int:
    """pplx-kernels' intranode allocations for SGLang's arguments here, by hand (sizing/pplx.py's formula): 2 ranks,
    1 per DP group, 8 experts (4 local), H 2048 bf16; the combine buffers (4 bytes a channel) dominate."""
    counts_region = 16 + 16
    send_buffer = counts_region + cap * 4 * 2048 * 4
    return (WORLD * send_buffer + 3 * 8 * WORLD + 4 * cap + 4 * 8 + 4 * 4 * WORLD + 6 * 4 * (4 * cap * WORLD) + 4)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.19", "0.5.22", "0.5.23"], ids=lambda release: f"sglang-{release}")
def test_counted_reported_advised_then_the_overflow_reported_before_sglangs_assertion(tmp_path, service, release):
    cluster = f"pplx-{release.replace('.', '-')}"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {PPLX.cap_env_var: str(CAP)})
    plan = {"deepep_model": MODEL, "layers": LAYERS,
            # SGLang's floor: max(chunked prefill 16, decode graph 64) = 64; its graph term alone (capped by the
            # running requests per DP rank, 40 // 2) would say 20
            "server_args": {"chunked_prefill_size": 16, "cuda_graph_max_bs_decode": CAP, "max_running_requests": 40},
            "steps": [*STEPS, {"pause": True}, OVERFLOW]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.pplx_rank_program").start(plan)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view)

    assert check_steps(run) == len(LAYERS) * len(STEPS)  # SGLang's outputs and received counts as without capwatch
    buffer_bytes = all_to_all_bytes(CAP)
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {release} (pplx backend, GPU {rank})" in log, log[-3000:]
        built = run.record(rank)["all_to_alls"]  # one AllToAll per process, with SGLang's arguments
        assert [(each["kind"], each["max_num_tokens"], each["dp_size"], each["hidden_dim_bytes"],
                 each["hidden_dim_scale_bytes"]) for each in built] == [("intranode", CAP, 1, 2048 * 2, 0)]
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        steps = run.record(rank)["steps"]
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(steps)
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(BATCHES[rank])
        sampled = steps[::len(LAYERS)]
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sum(step["ids"].numel() for step in sampled)
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_workspace_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_pplx_dp_size", **series) == 1
        assert value(metrics, "moe_a2a_pplx_info", transport="intranode", dispatch_dtype="bf16", **series) == 1
        assert value(metrics, "moe_a2a_info", a2a_backend="pplx", backend="sglang-pplx", **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert advice["floor_cap"] == CAP, advice  # SGLang's own required_pplx_dispatch_tokens_per_rank
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        (PPLX.name, PPLX.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == buffer_bytes
    assert advice["recommended_cap"] is None or CAP <= advice["recommended_cap"] <= PPLX.max_cap_tokens

    assert code != 0
    assert SGLANG_ASSERT in run.log(0), run.log(0)[-3000:]
    assert f"{PPLX.cap_env_var}=128" in run.log(0)  # capwatch's line before SGLang's assertion
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
