"""The SGLang plugin's cost: a real ``FlashinferDispatcher`` dispatch + combine, bare vs instrumented.

Two gloo rank processes of the sglang test venv (``.venv-sglang``, built by ``make test``) publish
one SGLang scheduler context each (``tests/sglang/rank_program.start_rank``, the plugin loaded
through its entry point) and build two dispatchers with the same geometry: one adopted by the
plugin, one handed back its own MoeAlltoAll and called through SGLang's unhooked ``dispatch`` (the
bare path). Decode steps alternate between them (which goes first alternates too). The transport
is the tests' MoeAlltoAll stand-in (capwatch's torch.distributed backend), identical on both sides.
Reports per size the medians and their ratio, and the median ratio over sizes (goal <= 1.02).

    python -m benchmarks.sglang_dispatch [--quick] [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.standalone import standalone

TOKEN_SIZES = (1, 8, 32, 128)  # decode batches per DP rank
MODEL = {"hidden_size": 1024, "top_k": 8, "num_experts": 16}
WORLD_SIZE = 2
GOAL_RATIO = 1.02


def _rank(run_dir: Path, rank: int) -> None:
    import torch
    from sglang.srt.layers.dp_attention import set_dp_buffer_len

    from tests.sglang.rank_program import start_rank

    torch.set_num_threads(1)  # two ranks on a small machine: no intra-op threads fighting gloo's
    plan = json.loads((run_dir / "plan.json").read_text())
    sglang = start_rank(plan, rank)
    instrumented = sglang.build(0)
    bare = sglang.build(1)
    bare.moe_a2a = bare.moe_a2a.adopted  # its own MoeAlltoAll back: SGLang's dispatcher as shipped
    unhooked_dispatch = type(bare).dispatch.__wrapped__  # the HookRegistry keeps the original here
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    generator = torch.Generator().manual_seed(rank)
    timings = {}
    for tokens in plan["sizes"]:
        set_dp_buffer_len(tokens * WORLD_SIZE, tokens, False, [tokens] * WORLD_SIZE)
        x = torch.randn(tokens, MODEL["hidden_size"], generator=generator).to(torch.bfloat16)
        ids = torch.randint(0, MODEL["num_experts"], (tokens, MODEL["top_k"]), generator=generator, dtype=torch.int32)
        topk = StandardTopKOutput(torch.rand(tokens, MODEL["top_k"], generator=generator), ids, None)

        def run_bare() -> None:
            out = unhooked_dispatch(bare, x, topk)
            bare.combine(sglang.module.FlashinferCombineInput(out.moe_output))

        def run_instrumented() -> None:
            out = instrumented.dispatch(x, topk)
            instrumented.combine(sglang.module.FlashinferCombineInput(out.moe_output))

        steps = {"bare": [], "instrumented": []}
        for iteration in range(plan["warmup"] + plan["iterations"]):
            order = (("bare", run_bare), ("instrumented", run_instrumented))
            for name, step in order if iteration % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                step()
                if iteration >= plan["warmup"]:
                    steps[name].append(time.perf_counter() - started)
        timings[str(tokens)] = steps
    (run_dir / f"timings-{rank}.json").write_text(json.dumps(timings))


def run(quick: bool = False) -> dict:
    from tests.sglang.ranks import RankRun, sglang_missing

    missing = sglang_missing()
    if missing is not None:
        return {"benchmark": "sglang_dispatch", "skipped": missing}
    iterations, warmup = (40, 5) if quick else (300, 20)
    with tempfile.TemporaryDirectory(prefix="capwatch-sglang-bench-") as folder:
        run_dir = Path(folder)
        group = RankRun(run_dir, WORLD_SIZE, {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_METRICS_BASE_PORT": "0"},
                        program="benchmarks.sglang_dispatch")
        group.start({"model": MODEL, "sizes": list(TOKEN_SIZES), "iterations": iterations, "warmup": warmup})
        codes = group.wait_exit(timeout_s=900)
        if codes != [0] * WORLD_SIZE:
            raise RuntimeError(f"benchmark ranks failed: {codes}\n{group.logs()}")
        results = [json.loads((run_dir / f"timings-{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    per_size = {}
    for tokens in map(str, TOKEN_SIZES):
        # A step ends when its slowest rank does.
        bare = [max(rank[tokens]["bare"][i] for rank in results) for i in range(iterations)]
        inst = [max(rank[tokens]["instrumented"][i] for rank in results) for i in range(iterations)]
        per_size[tokens] = {
            "bare_median_us": round(statistics.median(bare) * 1e6, 1),
            "instrumented_median_us": round(statistics.median(inst) * 1e6, 1),
            "ratio": round(statistics.median(inst) / statistics.median(bare), 4),
            "paired_ratio": round(statistics.median(i / b for i, b in zip(inst, bare)), 4),
        }
    median_ratio = statistics.median(entry["ratio"] for entry in per_size.values())
    return {
        "benchmark": "sglang_dispatch",
        "backend": f"sglang 0.5.23 FlashinferDispatcher, MoeAlltoAll stand-in over gloo, {WORLD_SIZE} processes, CPU",
        **MODEL,
        "iterations": iterations,
        "per_size": per_size,
        "median_ratio": round(median_ratio, 4),
        "goal_ratio": GOAL_RATIO,
        "meets_goal": median_ratio <= GOAL_RATIO,
    }


def render(figures: dict) -> None:
    if "skipped" in figures:
        print(f"skipped: {figures['skipped']}")
        return
    print(f"{figures['backend']}, hidden {figures['hidden_size']}, top_k {figures['top_k']}, "
          f"{figures['iterations']} interleaved iterations")
    print(f"{'tokens':>7} {'bare us':>10} {'plugin us':>10} {'ratio':>7} {'paired':>7}")
    for tokens, entry in figures["per_size"].items():
        print(f"{tokens:>7} {entry['bare_median_us']:>10} {entry['instrumented_median_us']:>10} "
              f"{entry['ratio']:>7} {entry['paired_ratio']:>7}")
    print(f"median ratio {figures['median_ratio']} (goal <= {figures['goal_ratio']})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] != "--quick":  # a rank, started by run() in the sglang venv
        _rank(Path(sys.argv[1]), int(sys.argv[2]))
    else:
        standalone("python -m benchmarks.sglang_dispatch", __doc__, run, render)
