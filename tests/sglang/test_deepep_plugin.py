"""The plugin on SGLang's own DeepEP dispatcher classes in gloo ranks (``deep_ep.Buffer`` the one stand-in,
``deepep_standin.py``), per verified release at its ends (0.5.19, 0.5.23): loaded by ``load_plugins()``, started
by ``configure_scheduler_process``; two-batch overlap in auto mode with FP8 dispatch. While the ranks are alive
their /metrics must say what they dispatched (each rank's own batch per micro-batch against the cap, the pairs
sent and received, the buffer once per process) and the service must advise DeepEP's variable from their
reports; then one rank's batch above the cap is counted and its final report reaches the service before
DeepEP's assertion ends that rank."""

from __future__ import annotations

import pytest
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.sglang_engine.deepep import plan_deepep_buffer

from tests.sglang.deepep_standin import DEEPEP_ASSERT
from tests.sglang.plugin_run import get_json, plugin_env, scrape_at_pause_then_overflow, wait_for
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_dispatcher import CAP, GEOMETRY, MODEL, WORLD, check_steps
from tests.support.ports import free_port_block
from tests.support.service import ServiceProcess

LAYERS = [3, 1]  # built out of order: layer 1 leads, both of its micro-batch dispatchers
# Per rank: the local batch of each dispatch of the leading layer (one per micro-batch).
STEPS = [{"tokens": [3, 5]}, {"micro_batches": [[2, 4], [CAP, 1]]}, {"tokens": [0, 7]}]
BATCHES = {0: [3, 2, 4, 0], 1: [5, CAP, 1, 7]}
OVERFLOW = {"tokens": [CAP + 1, 3]}  # rank 0 alone: DeepEP refuses it there


def value(metrics: dict, name: str, **labels) -> float:
    matches = [v for (n, ls), v in metrics.items()
               if n == name and all(dict(ls).get(k) == str(w) for k, w in labels.items())]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} samples"
    return matches[0]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service") / "capwatch.sqlite3").start(timeout_s=60)
    yield process
    process.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"], ids=lambda release: f"sglang-{release}")
def test_counted_reported_advised_then_the_overflow_reported_before_deepeps_assertion(tmp_path, service, release):
    cluster = f"deepep-{release.replace('.', '-')}"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {DEEPEP.cap_env_var: str(CAP)})
    plan = {"plugins": True, "deepep_model": MODEL, "deepep_mode": "auto",
            "dispatch_dtype": "fp8", "two_batch_overlap": True, "layers": LAYERS,
            "steps": [*STEPS, {"pause": True}, OVERFLOW]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.deepep_rank_program").start(plan)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view_with_both_ranks)

    assert check_steps(run) == len(LAYERS) * 4  # SGLang's outputs and received counts as without capwatch
    planned = plan_deepep_buffer(GEOMETRY, WORLD, CAP, "auto")
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {release} (deepep backend, GPU {rank})" in log, log[-3000:]
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        steps = run.record(rank)["steps"]
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(steps)
        # Each micro-batch of the leading layer is a step: its own batch against the cap.
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(BATCHES[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(BATCHES[rank])
        # The traffic sample is the leading layer alone for what it sends (its dispatches: the first of each
        # micro-batch's layers) and the next layer in model order for what it receives (one op per dispatch).
        sending, receiving = steps[::len(LAYERS)], steps[1::len(LAYERS)]
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sum(step["ids"].numel() for step in sending)
        assert value(metrics, "moe_a2a_tokens_received_total", **series) == \
            sum(int(step["received"].sum()) for step in receiving)
        # (Not the leader's: its layer and the next one route differently, so this tells the two apart.)
        assert sum(int(step["received"].sum()) for step in receiving) != sum(int(step["received"].sum())
                                                                              for step in sending)
        assert value(metrics, "moe_a2a_cap_tokens", **series) == CAP
        # The one buffer of the process, as SGLang sized it, once however many layers and micro-batches use it.
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == planned.buffer_bytes_per_rank
        assert value(metrics, "moe_a2a_workspace_bytes", **series) == planned.buffer_bytes_per_rank
        assert value(metrics, "moe_a2a_info", a2a_backend="deepep", backend="sglang-deepep", **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        (DEEPEP.name, DEEPEP.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == planned.buffer_bytes_per_rank

    assert code != 0
    assert DEEPEP_ASSERT in run.log(0), run.log(0)[-3000:]
    assert f"{DEEPEP.cap_env_var}=256" in run.log(0)  # capwatch's line before DeepEP's assertion
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
    assert final["forward_steps_total"] == len(BATCHES[0]) + 1  # the refused batch is in the histogram too


def _view_with_both_ranks(service, cluster: str) -> dict:
    view = get_json(f"{service.url}/v1/clusters/{cluster}")
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1], view
    assert view["group_max_runtime_tokens"] == CAP, view
    return view


def _final_rank_zero(service, cluster: str) -> dict:
    view = get_json(f"{service.url}/v1/clusters/{cluster}")
    rank = next(rank for rank in view["ranks"] if rank["ep_rank"] == 0)
    assert rank["final"], rank
    return rank
