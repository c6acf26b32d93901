"""Mega MoE's floor against SGLang 0.5.23's own start-up check, in the sglang venv: on a model SGLang checks (its
MoE blocks have no fallback: Qwen2-MoE) capwatch's floor is the smallest cap ``validate_mega_moe_token_budget_for_model``
accepts, whichever term binds (each rank's prefill budget, the decode graph); on one SGLang does not check (DeepSeek-V3,
whose MoE falls back) SGLang accepts any cap and capwatch computes the captured graphs' term."""

from __future__ import annotations

import json

import pytest

from tests.sglang.releases import release_path
from tests.sglang.ranks import MODEL_CONFIG, sglang_python
from tests.sglang.test_megamoe_plugin import MODEL_CONFIG as DEEPSEEK_CONFIG
from tests.support import launcher

SERVER = {"tp_size": 2, "ep_size": 2, "dp_size": 2, "enable_dp_attention": True}
QWEN_CONFIG = {**MODEL_CONFIG, "max_position_embeddings": 32768}  # room for a prefill chunk that binds


def floors(tmp_path, *servers: tuple[dict, dict]) -> list[dict]:
    """Each (model config, server args)'s floor by capwatch and by SGLang, in one sglang process."""
    plans = []
    for index, (config, server_args) in enumerate(servers):
        model_dir = tmp_path / f"model-{index}"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config))
        plans.append({"model_dir": str(model_dir), "server_args": {**SERVER, **server_args}})
    done = launcher.run("-m", "tests.sglang.megamoe_floor_program", json.dumps(plans), python=sglang_python(),
                        path_first=release_path("0.5.23"), imports_tests=True, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_sglangs_rule_where_it_checks_and_the_computed_one_where_it_does_not(tmp_path):
    prefill, decode, unchecked = floors(
        tmp_path, (QWEN_CONFIG, dict(chunked_prefill_size=4096, cuda_graph_max_bs_decode=16)),
        (QWEN_CONFIG, dict(chunked_prefill_size=64, cuda_graph_max_bs_decode=48)),
        (DEEPSEEK_CONFIG, dict(chunked_prefill_size=512, cuda_graph_max_bs_decode=16)))
    assert prefill["floor_rule"] == "sglang" and prefill["capwatch"] == prefill["sglang"], prefill
    assert prefill["sglang"] > 32 and any("prefill chunk" in what for what in prefill["terms"]), prefill  # it binds
    assert decode["floor_rule"] == "sglang" and decode["capwatch"] == decode["sglang"], decode
    assert not any("prefill chunk" in what and str(decode["sglang"]) in what for what in decode["terms"]), decode
    assert unchecked["floor_rule"] == "capwatch" and unchecked["sglang"] == 0, unchecked
    assert unchecked["capwatch"] == 32 and not any("prefill chunk" in what for what in unchecked["terms"]), unchecked
