"""The plugin on SGLang 0.5.23's own Mega MoE path (``layers/moe/mega_moe.py``) in gloo ranks (DeepGEMM and the
GPU's facts the stand-ins, ``megamoe_standin.py``): loaded by ``load_plugins()``, started by
``configure_scheduler_process``. While the ranks are alive their /metrics say what went through the cap (R, the
DP group's largest batch, and each rank's own; the pairs sent; the symmetric buffer's bytes) and how many steps fell
back to the non-mega path because R exceeded the cap — SGLang's ``should_use_mega_moe`` says nothing when it does;
the service advises raising Mega MoE's own variable to stop the fallback, priced in the buffer's bytes, as memory
traded for speed, and finds the fallback. Then a captured batch above the cap (the mega path whatever its size) is
counted and its final report reaches the service before SGLang's assertion naming the variable ends that rank. A
draft model's layer is counted in the draft role."""

from __future__ import annotations

import json
import urllib.error

import pytest
import torch
from capwatch.backends.megamoe import RULES as MEGAMOE
from capwatch.sglang_plugin.hooks.megamoe import fallback_line

from tests.sglang.megamoe_standin import standin_num_bytes
from tests.sglang.plugin_run import plugin_env, scrape_at_pause_then_overflow
from tests.sglang.ranks import RankRun
from tests.sglang.test_deepep_plugin import service  # noqa: F401  (the service the ranks report to)
from tests.sglang.test_deepep_plugin import _final_rank_zero, get_json, value, wait_for
from tests.support.ports import free_port_block

WORLD = 2
CAP = 64
MODEL = {"hidden_size": 512, "top_k": 2, "num_experts": 8, "intermediate_size": 128}
# A tiny DeepSeek-V3 (its MoE falls back above the cap; SGLang's Qwen MoE blocks have no fallback).
MODEL_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": MODEL["hidden_size"],
    "intermediate_size": 256, "moe_intermediate_size": MODEL["intermediate_size"], "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": MODEL["top_k"], "num_hidden_layers": 4, "first_k_dense_replace": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 256,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
LAYERS = [3, 1]  # adopted at their first call, led by the lowest
FALLBACK_R = CAP + 6
STEPS = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}, {"tokens": [FALLBACK_R, 2]}, {"tokens": [0, 7]}]
PATHS = ["mega", "mega", "fallback", "mega"]  # R = the group's largest batch: rank 1 falls back with 2 tokens
OVERFLOW = {"tokens": [CAP + 1, 3], "capture": True}  # captured: the mega path, and SGLang's assertion on rank 0
SGLANG_ASSERTION = f"mega MoE: num_tokens={CAP + 1} exceeds cap {MEGAMOE.cap_env_var}={CAP}"


def megamoe_plan(tmp_path, layers: list[int], steps: list[dict], **more) -> dict:
    """A rank plan over a tiny DeepSeek-V3 written to ``tmp_path`` (the model SGLang's start-up reads)."""
    model_dir = tmp_path / "deepseek"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return {"megamoe_model": MODEL, "layers": layers, "model_dir": str(model_dir),
            "server_args": {"chunked_prefill_size": CAP * WORLD, "cuda_graph_max_bs_decode": 16}, "steps": steps,
            **more}


def check_steps(run: RankRun) -> None:
    """Every layer's output is 2 x each token times its routing weights' sum on either path (SGLang's Mega MoE ran as
    without capwatch), on the path SGLang chose."""
    for rank in range(WORLD):
        done = run.record(rank)["steps"]
        # rank 1 also ran the captured step (the mega path); rank 0's ended in SGLang's assertion
        assert [step["path"] for step in done] == [path for path in PATHS + ["mega"] * rank for _ in LAYERS]
        for step in done:
            expected = step["x"].float() * 2 * step["weights"].sum(1, keepdim=True)
            torch.testing.assert_close(step["output"].float(), expected, atol=0.05, rtol=0.02)


@pytest.mark.timeout(900)
def test_counted_fallbacks_advised_then_the_overflow_reported_before_sglangs_assertion(tmp_path, service):
    cluster = "megamoe-0-5-23"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {MEGAMOE.cap_env_var: str(CAP)})
    plan = megamoe_plan(tmp_path, LAYERS, [*STEPS, {"pause": True}, OVERFLOW])
    run = RankRun(tmp_path, WORLD, env, metrics_base_port=base_port,
                  program="tests.sglang.megamoe_rank_program").start(plan)
    scraped, view, advice, code = scrape_at_pause_then_overflow(run, service, cluster, _view)

    check_steps(run)
    buffer_bytes = standin_num_bytes(WORLD, MODEL["num_experts"], CAP, MODEL["top_k"], MODEL["hidden_size"],
                                     MODEL["intermediate_size"])
    group_r = [max(planned["tokens"]) for planned in STEPS]
    mega = [index for index, path in enumerate(PATHS) if path == "mega"]
    for rank in range(WORLD):
        log = run.log(rank)
        assert f"capwatch: enabled on sglang 0.5.23 (megamoe backend, GPU {rank})" in log, log[-3000:]
        assert run.record(rank)["buffers"] == [(buffer_bytes, CAP)]  # one symmetric buffer a process
        metrics, series = scraped[rank], {"dispatcher": "target", "ep_rank": rank, "ep_group": cluster}
        leader = run.record(rank)["steps"][::len(LAYERS)]  # the lowest layer's steps
        assert value(metrics, "moe_a2a_megamoe_fallback_steps_total", **series) == 1
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(STEPS)
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == len(mega) * len(LAYERS)
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == FALLBACK_R  # the group's R, both ranks
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(group_r)
        assert value(metrics, "moe_a2a_local_tokens_max", **series) == max(
            planned["tokens"][rank] for planned in STEPS)
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == sum(leader[index]["ids"].numel()
                                                                             for index in mega)
        assert value(metrics, "moe_a2a_cap_tokens", **series) == CAP
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_megamoe_buffer_bytes", **series) == buffer_bytes
        assert value(metrics, "moe_a2a_info", a2a_backend="megamoe", backend="sglang-megamoe",
                     cap_variable=MEGAMOE.cap_env_var, **series) == 1
        assert not any(v for (n, _), v in metrics.items() if n == "moe_a2a_overflow_events_total")
        # SGLang prints nothing when it falls back: capwatch's one line, with what stops it and what that costs.
        assert fallback_line(FALLBACK_R, CAP, rank, WORLD, buffer_bytes) in log, log[-3000:]
        assert log.count("fell back to the slower non-mega MoE path") == 1

    assert view["cap"] == CAP and view["group_max_runtime_tokens"] == FALLBACK_R, view
    findings = {finding["kind"]: finding for finding in view["findings"]}
    fallback = findings["cap_fallback"]
    assert fallback["ranks"] == [0, 1] and fallback["severity"] == "info", fallback
    assert f"{MEGAMOE.cap_env_var}=128 to stop the fallback" in fallback["message"], fallback
    assert "no rank is at risk" in fallback["message"], fallback
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"], advice["action"]) == \
        (MEGAMOE.name, MEGAMOE.cap_env_var, CAP, "raise"), advice
    assert advice["recommended_cap"] >= FALLBACK_R, advice
    assert advice["workspace_bytes_per_rank_current"] == buffer_bytes
    assert advice["workspace_bytes_per_rank_recommended"] == -(-buffer_bytes * advice["recommended_cap"] // CAP)
    stop = [reason for reason in advice["reasons"] if reason.startswith("raise to stop the fallback")]
    assert len(stop) == 1 and "memory for speed: no rank is at risk" in stop[0], advice["reasons"]
    # The floor capwatch computes: the captured decode graph (--cuda-graph-max-bs-decode 16 resolves to SGLang's
    # 32-request bucket here; an eager prefill above the cap only falls back)
    assert advice["floor_cap"] == 32, advice

    assert code != 0
    assert SGLANG_ASSERTION in run.log(0), run.log(0)[-3000:]
    assert f"megamoe dispatch has {CAP + 1} tokens on this rank but the per-rank cap is {CAP}" in run.log(0)
    assert run.log(0).index(f"{MEGAMOE.cap_env_var}=128 (or more)") < run.log(0).index(SGLANG_ASSERTION)
    final = wait_for(lambda: _final_rank_zero(service, cluster))
    assert final["overflow_events"] == {"runtime_over_cap/raised": 1}, final
    assert final["forward_steps_total"] == len(STEPS) + 1  # the refused batch is in the histogram too



@pytest.mark.timeout(900)
def test_a_draft_models_layer_is_counted_in_the_draft_role(tmp_path, service):
    """A draft model's Mega MoE layer (an MTP layer), run as SGLang's EAGLE worker runs the draft (in its speculative
    A2A context, Mega MoE its speculative backend), is adopted into the draft role at its first call: its own
    series, its own steps and calls, nothing added to the target's."""
    cluster = "megamoe-draft-0-5-23"
    base_port = free_port_block(WORLD)  # rank r exports on base + r
    env = plugin_env(cluster, base_port, service.url, {MEGAMOE.cap_env_var: str(CAP)})
    steps = [{"tokens": [3, 5]}, {"tokens": [CAP, 1]}]
    draft_layer = 5  # after the target's layers, in the draft's own forward
    run = RankRun(tmp_path, WORLD, env, metrics_base_port=base_port, program="tests.sglang.megamoe_rank_program"
                  ).start(megamoe_plan(tmp_path, [*LAYERS, draft_layer], steps, draft=[draft_layer]))
    try:
        run.wait_ready()
        scraped = {rank: run.metrics(rank) for rank in range(WORLD)}
        assert run.release() == [0] * WORLD
    finally:
        run.kill()
    for rank in range(WORLD):
        assert [step["path"] for step in run.record(rank)["steps"]] == ["mega"] * (len(LAYERS) + 1) * len(steps)
        for role, layers in (("target", len(LAYERS)), ("draft", 1)):
            series = {"dispatcher": role, "ep_rank": rank, "ep_group": cluster}
            assert value(scraped[rank], "moe_a2a_dispatch_calls_total", **series) == layers * len(steps), role
            assert value(scraped[rank], "moe_a2a_forward_steps_total", **series) == len(steps), role
            assert value(scraped[rank], "moe_a2a_runtime_tokens_max", **series) == CAP, role

def _view(service, cluster: str) -> dict:
    """The group's view once both ranks have reported their fallback (a 404 until the first report arrives)."""
    try:
        view = get_json(f"{service.url}/v1/clusters/{cluster}")
    except urllib.error.HTTPError as error:
        raise AssertionError(f"no view of {cluster} yet: {error}") from None
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1], view
    assert view["group_max_runtime_tokens"] == FALLBACK_R, view
    return view
