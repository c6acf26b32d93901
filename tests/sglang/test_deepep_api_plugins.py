"""The plugin on SGLang 0.5.19's and 0.5.23's own Mooncake EP and NIXL EP dispatcher classes (DeepEP's low-latency
API shape; one body, each backend a case) in gloo ranks (the library's ``Buffer`` the one stand-in,
``mooncake_standin.py``, ``nixl_standin.py``; ``deepep_api_rank_program.py``): loaded by ``load_plugins()``, started
by ``configure_scheduler_process``. While the ranks are alive their /metrics say what they dispatched (each rank's
own batch against the cap, the pairs sent, the buffer's bytes as the library's own size hint gives them for
SGLang's arguments, once per process) and the service advises the backend's own variable; then one rank's batch
above the cap is counted and its final report reaches the service before the library's assertion ends that rank
(SGLang checks nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from capwatch.backends.mooncake import RULES as MOONCAKE
from capwatch.backends.nixl import RULES as NIXL
from capwatch.sizing.backends import BackendCapRules

from tests.sglang import mooncake_standin, nixl_standin
from tests.sglang.deepep_standin import DEEPEP_ASSERT
from tests.sglang.plugin_run import plugin_env, scrape_at_pause_then_overflow
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_dispatcher import check_steps
from tests.sglang.test_deepep_plugin import service  # noqa: F401  (the service the ranks report to)
from tests.sglang.test_deepep_plugin import _final_rank_zero, value, wait_for
from tests.sglang.test_deepep_v2_plugin import _view
from tests.support.ports import free_port_block

WORLD = 2
CAP = 64
MODEL = {"hidden_size": 2048, "top_k": 2, "num_experts": 8}  # as the DeepEP tests (check_steps reads it)
LAYERS = [3, 1]
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}, {"tokens": [0, 7]}]
BATCHES = {0: [3, CAP, 0], 1: [5, 1, 7]}
OVERFLOW = {"tokens": [CAP + 1, 3]}


@dataclass(frozen=True)
class Case:
    rules: BackendCapRules
    size_hint: Callable[[int, int, int, int], int]  # the library's own, as the stand-in computes it
    assertion: str  # what the library's assertion says when a batch is above the cap


CASES = {"mooncake": Case(MOONCAKE, mooncake_standin.size_hint, mooncake_standin.MOONCAKE_ASSERT),
         "nixl": Case(NIXL, nixl_standin.size_hint, DEEPEP_ASSERT)}  # NIXL EP's C++ assert is DeepEP's text


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"], ids=lambda release: f"sglang-{release}")
@pytest.mark.parametrize("backend", list(CASES))
def test_counted_reported_advised_then_the_overflow_reported_before_the_librarys_assertion(tmp_path, backend, release,
                                                                                          service):
    case = CASES[backend]
    rules = case.rules
    cluster = f"{backend}-{release.replace('.', '-')}"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {rules.cap_env_var: str(CAP)})
    plan = {"backend": backend, "deepep_model": MODEL, "layers": LAYERS,
            "server_args": {"chunked_prefill_size": CAP, "cuda_graph_max_bs_decode": 16},
            "steps": [*STEPS, {"pause": True}, OVERFLOW]}
    run = RankRun(tmp_path, WORLD, env, sglang_release=release, metrics_base_port=base_port,
                  program="tests.sglang.deepep_api_rank_program").start(plan)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view)

    assert check_steps(run) == len(LAYERS) * len(STEPS)  # SGLang's outputs and received counts as without capwatch
    buffer_bytes = case.size_hint(CAP, MODEL["hidden_size"], WORLD, MODEL["num_experts"])
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {release} ({backend} backend, GPU {rank})" in log, log[-3000:]
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
        assert value(metrics, f"moe_a2a_{backend}_buffer_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_info", a2a_backend=backend, backend=f"sglang-{backend}", **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == CAP
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == \
        (rules.name, rules.cap_env_var, CAP), advice
    assert advice["workspace_bytes_per_rank_current"] == buffer_bytes
    assert advice["recommended_cap"] is None or advice["recommended_cap"] <= rules.max_cap_tokens

    assert code != 0
    assert case.assertion in run.log(0), run.log(0)[-3000:]
    assert f"{rules.cap_env_var}=128" in run.log(0)  # capwatch's line before the library's assertion
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
