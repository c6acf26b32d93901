"""How fast caps are priced: the advisor calls ``plan_workspace`` for many caps per request.

Medians over repeated sweeps of 256 caps (128 ... 32768) for DeepSeek-V3 on 8 ranks, side by side with
the bare formula ``workspace_bytes_per_rank`` (what the validation and the plan record add), and the
cost of one ``largest_cap_within`` budget answer. ``python -m benchmarks.plan_pricing [--quick]``.
"""

from __future__ import annotations

import argparse
import json

from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.model_presets import model_geometry
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token
from capwatch.sglang_engine.flashinfer import largest_plan_within, plan_workspace

from benchmarks.timing import median_seconds

CAPS = range(128, 32768 + 1, 128)


def run(quick: bool = False) -> dict:
    repeats = 5 if quick else 25
    geometry = model_geometry("deepseek-v3")
    dispatch, combine = dispatch_bytes_per_token(7168, 8, "bf16"), combine_bytes_per_token(7168)

    def sweep_plans() -> None:
        for cap in CAPS:
            plan_workspace(geometry, 8, cap, "nvfp4", mode="sglang")

    def sweep_formula() -> None:
        for cap in CAPS:
            workspace_bytes_per_rank(8, cap, dispatch, combine)

    def budget_answers() -> None:
        for budget_gib in (1, 2, 4, 8):
            largest_plan_within(budget_gib << 30, geometry, 8)

    plan_s = median_seconds(sweep_plans, repeats) / len(CAPS)
    formula_s = median_seconds(sweep_formula, repeats) / len(CAPS)
    budget_s = median_seconds(budget_answers, repeats) / 4
    return {
        "caps_per_sweep": len(CAPS),
        "plan_workspace_median_us": round(plan_s * 1e6, 2),
        "workspace_bytes_per_rank_median_us": round(formula_s * 1e6, 2),
        "plan_over_formula_ratio": round(plan_s / formula_s, 2),
        "largest_cap_within_median_us": round(budget_s * 1e6, 1),
        "plans_per_second": int(1 / plan_s),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(quick=parser.parse_args().quick), indent=2))
