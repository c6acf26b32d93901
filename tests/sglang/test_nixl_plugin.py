"""The plugin on SGLang 0.5.19's and 0.5.23's own NIXL EP dispatcher classes in gloo ranks (NIXL EP's ``Buffer`` the
one stand-in, ``nixl_standin.py``): loaded by ``load_plugins()``, started by ``configure_scheduler_process``. While
the ranks are alive their /metrics say what they dispatched (each rank's own batch against the cap, the pairs sent,
the buffer's bytes as NIXL EP's own size hint gives them for SGLang's arguments, once per process) and the service
advises NIXL's own variable; then one rank's batch above the cap is counted and its final report reaches the service
before NIXL EP's assertion ends that rank (SGLang checks nothing)."""

from __future__ import annotations

import pytest
from capwatch.backends.nixl import RULES as NIXL

from tests.sglang.deepep_standin import DEEPEP_ASSERT
from tests.sglang.nixl_standin import size_hint
from tests.sglang.ranks import START_TIMEOUT_S, RankRun
from tests.sglang.test_deepep_dispatcher import check_steps
from tests.sglang.test_deepep_plugin import service  # noqa: F401  (the service the ranks report to)
from tests.sglang.test_deepep_plugin import _final_rank_zero, get_json, value, wait_for
from tests.sglang.test_deepep_v2_plugin import _view
from tests.support.ports import free_port

WORLD = 2
CAP = 64
MODEL = {"hidden_size": 2048, "top_k": 2, "num_experts": 8}  # as the DeepEP tests (check_steps reads it)
LAYERS = [3, 1]
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}, {"tokens": [0, 7]}]
BATCHES = {0: [3, CAP, 0], 1: [5, 1, 7]}
OVERFLOW = {"tokens": [CAP + 1, 3]}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"], ids=lambda release: f"sglang-{release}")
def test_counted_reported_advised_then_the_overflow_reported_before_nixl_eps_assertion(tmp_path, release, service):
    cluster = f"nixl-{release.replace('.', '-')}"
    base_port = free_port()
    env = {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": cluster, "CAPWATCH_METRICS_BASE_PORT": str(base_port),
           "CAPWATCH_SERVICE_URL": service.url, "CAPWATCH_REPORT_INTERVAL_S": "0.5", NIXL.cap_env_var: str(CAP)}
    plan = {"master_port": free_port(), "deepep_model": MODEL, "layers": LAYERS,
            "server_args": {"chunked_prefill_size": CAP, "cuda_graph_max_bs_decode": 16},
            "steps": [*STEPS, {"pause": True}, OVERFLOW]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.nixl_rank_program").start(plan)
    try:
        run.wait_ready("paused")
        scraped = {rank: run.metrics(rank) for rank in range(WORLD)}
        try:
            view = wait_for(lambda: _view(service, cluster))
        except AssertionError as error:
            raise AssertionError(f"{error}\n{run.logs()}") from None
        advice = get_json(f"{service.url}/v1/clusters/{cluster}/advice")
        (run.run_dir / "resume").write_text("")
        code = run.processes[0].wait(timeout=START_TIMEOUT_S)
    finally:
        run.kill()

    assert check_steps(run) == len(LAYERS) * len(STEPS)  # SGLang's outputs and received counts as without capwatch
    buffer_bytes = size_hint(CAP, MODEL["hidden_size"], WORLD, MODEL["num_experts"])
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {release} (nixl backend, GPU {rank})" in log, log[-3000:]
        assert run.record(rank)["buffers"] == [buffer_bytes]  # what SGLang allocated: the library's own hint
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        steps = run.record(rank)["steps"]
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(steps)
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(BATCHES[rank])
        sampled = steps[::len(LAYERS)]
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sum(step["ids"].numel() for step in sampled)
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_nixl_buffer_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_info", a2a_backend="nixl", backend="sglang-nixl", **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        (NIXL.name, NIXL.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == buffer_bytes
    assert advice["recommended_cap"] is None or advice["recommended_cap"] <= NIXL.max_cap_tokens

    assert code != 0
    assert DEEPEP_ASSERT in run.log(0), run.log(0)[-3000:]
    assert f"{NIXL.cap_env_var}=128" in run.log(0)  # capwatch's line before NIXL EP's assertion
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
