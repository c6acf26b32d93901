"""The plugin on SGLang 0.5.19's and 0.5.23's own MoRI dispatcher classes in gloo ranks (``mori`` and aiter's
quantizer lookup the stand-ins, ``mori_standin.py``): loaded by ``load_plugins()``, started by
``configure_scheduler_process``. While the ranks are alive their /metrics must say what they dispatched (each rank's
own batch against the cap, the tokens sent, the op's bytes) and the service must advise MoRI's variable from their
reports; then one rank's batch above the cap is counted, its final report reaches the service and the dispatch is
refused *before* MoRI sees it (MoRI itself would take it silently: the second test, without capwatch)."""

from __future__ import annotations

import pytest
from capwatch.backends import spec_of
from capwatch.backends.mori import MoriOp, op_config
from capwatch.sizing.mori import mori_op_plan

from tests.sglang.plugin_run import plugin_env, scrape_at_pause_then_overflow
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_plugin import _final_rank_zero, get_json, value, wait_for
from tests.support.ports import free_port_block
from tests.support.service import ServiceProcess

WORLD, CAP, CHUNK = 2, 128, 64  # SGLang's own start-up check: the prefill chunk <= the cap
MODEL = {"hidden_size": 64, "top_k": 2, "num_experts": 8}
LAYERS = [3, 1]
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}, {"tokens": [0, 7]}]
OVERFLOW = {"tokens": [CAP + 1, 3]}  # rank 0 alone
MORI = spec_of("mori").rules


def run_ranks(tmp_path, env: dict, plan: dict, release: str = "0.5.23") -> RankRun:
    run = RankRun(tmp_path, WORLD, {MORI.cap_env_var: str(CAP), **env}, sglang_release=release,
                  metrics_base_port=int(env.get("CAPWATCH_METRICS_BASE_PORT", 0)),
                  program="tests.sglang.mori_rank_program")
    return run.start({"mori_model": MODEL, "layers": LAYERS,
                      "chunked_prefill_size": CHUNK, **plan})


def check_steps(run: RankRun) -> int:
    """Every combine gives back 2 x each token times its routing weights' sum (each rank's expert stand-in doubles
    the rows of its own experts), as without capwatch."""
    import torch

    records = [run.record(rank) for rank in range(WORLD)]
    for record in records:
        for done in record["steps"]:
            expected = done["x"].float() * 2 * done["weights"].sum(1, keepdim=True)
            torch.testing.assert_close(done["combined"].float(), expected, atol=0.05, rtol=0.02)
    return len(records[0]["steps"])


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service") / "capwatch.sqlite3").start(timeout_s=60)
    yield process
    process.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"], ids=lambda release: f"sglang-{release}")
def test_counted_reported_advised_then_the_overflow_refused_before_mori_sees_it(tmp_path, release, service):
    cluster = f"mori-{release.replace('.', '-')}"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url)
    run = run_ranks(tmp_path, env, {"plugins": True, "steps": [*STEPS, {"pause": True}, OVERFLOW]}, release)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view_with_both_ranks)

    assert check_steps(run) == len(LAYERS) * len(STEPS)
    batches = {rank: [step["tokens"][rank] for step in STEPS] for rank in range(WORLD)}
    op = MoriOp(kernel="IntraNode", experts_per_rank=MODEL["num_experts"] // WORLD)
    planned = mori_op_plan(op_config(WORLD, MODEL["hidden_size"], MODEL["top_k"], op), CAP).op_bytes
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {release} (mori backend" in log, log[-3000:]
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        record = run.record(rank)
        assert record["ops"] == [(CAP, "IntraNode", WORLD * CAP)]  # one op, shared by both layers
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(LAYERS) * len(STEPS)
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(STEPS)
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(batches[rank])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(batches[rank])
        # The leading layer's (token, expert) pairs, as every backend counted from its top-k ids counts them.
        sent = sum(int((step["ids"] >= 0).sum()) for step in record["steps"][::len(LAYERS)])
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sent
        assert value(metrics, "moe_a2a_cap_tokens", **series) == CAP
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == planned
        assert value(metrics, "moe_a2a_workspace_bytes", **series) == planned
        assert value(metrics, "moe_a2a_info", a2a_backend="mori", backend="sglang-mori", **series) == 1
        assert value(metrics, "moe_a2a_mori_info", kernel="IntraNode", combine_quant="none", **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        ("mori", MORI.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == planned

    assert code != 0
    log = run.log(0)
    assert f"{MORI.cap_env_var}=256" in log and "capwatch refused the dispatch" in log, log[-3000:]
    assert run.record(0)["overflowed"] == 0  # MoRI never saw the batch
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
    assert final["forward_steps_total"] == len(STEPS) + 1  # the refused batch is in the histogram too


@pytest.mark.timeout(600)
def test_without_capwatch_mori_takes_a_batch_above_its_cap_silently(tmp_path):
    """What the guard is for: SGLang and MoRI check nothing, the rank goes on (MoRI wrote past its buffers)."""
    run = run_ranks(tmp_path, {}, {"steps": [OVERFLOW]})
    run.wait_ready()
    assert run.release() == [0] * WORLD
    assert run.record(0)["overflowed"] == len(LAYERS)  # every layer's dispatch, unnoticed
    assert "capwatch" not in run.log(0)


def _view_with_both_ranks(service, cluster: str) -> dict:
    view = get_json(f"{service.url}/v1/clusters/{cluster}")
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1], view
    assert view["group_max_runtime_tokens"] == CAP, view
    return view
