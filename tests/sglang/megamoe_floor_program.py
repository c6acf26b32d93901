"""Mega MoE's floor for one server, by capwatch and by SGLang 0.5.23's own start-up check: run by the sglang venv's
python. Resolves the plan's server args (Mega MoE on a CUDA SM100 machine, SGLang's ``override_platform``), asks
``floors/megamoe.py`` for its limits and the floor they give, then finds the smallest cap SGLang's
``validate_mega_moe_token_budget_for_model`` accepts (0 where it accepts every cap), and prints both as JSON.

    python -m tests.sglang.megamoe_floor_program PLANS_JSON   (a list of plans: one answer each, in one process)
"""

from __future__ import annotations

import json
import os
import sys


def smallest_accepted(server_args, variable: str, most: int) -> int:
    """The smallest cap SGLang's start-up check accepts (0: it accepts 1, so checks nothing that binds)."""
    from sglang.srt.arg_groups.mega_moe_hook import validate_mega_moe_token_budget_for_model

    def accepted(cap: int) -> bool:
        os.environ[variable] = str(cap)
        try:
            validate_mega_moe_token_budget_for_model(server_args)
        except ValueError:
            return False
        return True

    if accepted(1):
        return 0
    low, high = 1, most  # refused at low, accepted at high
    assert accepted(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if accepted(middle) else (middle, high)
    return high


def floor(plan: dict) -> dict:
    from sglang.srt.runtime_context import SpawnRanks, override_platform, publish
    from sglang.srt.server_args import ServerArgs

    from capwatch.backends import SPECS
    from capwatch.sglang_engine.floor import sglang_floor_terms
    from capwatch.sglang_plugin.floors import megamoe

    server_args = ServerArgs(model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu",
                             moe_a2a_backend="megamoe", **plan["server_args"])
    with override_platform(is_cuda=True, is_sm100=True):
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        limits = megamoe.limits(server_args, "0.5.23", "0.5.23")
        rules = SPECS["megamoe"].rules
        terms = sglang_floor_terms(limits, rules)
        sglang = smallest_accepted(server_args, rules.cap_env_var, 1 << 16)
    return {"floor_rule": limits.floor_rule, "capwatch": max((tokens for tokens, _ in terms), default=0),
            "terms": [what for _, what in terms], "sglang": sglang}


if __name__ == "__main__":
    print(json.dumps([floor(plan) for plan in json.loads(sys.argv[1])]))
