"""Overhead of InstrumentedDispatcher over the bare backend: dispatch + combine at decode sizes.

Two gloo rank processes run the same TorchA2ABackend bare and instrumented, interleaved
(alternating which goes first) so that machine noise hits both alike. Reports per size: the
medians and their ratio, the median of the per-iteration paired ratios, and the counter updates
timed alone as a share of the bare step; then the median ratio over sizes (goal <= 1.02).

    python -m benchmarks.dispatch_overhead [--quick] [--json]
"""

from __future__ import annotations

import statistics
import time

from benchmarks.standalone import standalone

TOKEN_SIZES = (1, 8, 32, 128)
HIDDEN = 256
TOP_K = 8
NUM_EXPERTS = 16
WORLD_SIZE = 2
GOAL_RATIO = 1.02


def _rank(rank: int, world_size: int, sizes: tuple[int, ...], iterations: int, warmup: int) -> dict:
    import torch
    from capwatch.dispatcher.counters import DispatchCounters
    from capwatch.dispatcher.instrumented import InstrumentedDispatcher
    from capwatch.dispatcher.torch_backend import TorchA2ABackend

    backend = TorchA2ABackend(NUM_EXPERTS, TOP_K)
    cap = max(sizes)
    counters = DispatchCounters(cap, world_size)
    instrumented = InstrumentedDispatcher(backend, counters, cap)
    generator = torch.Generator().manual_seed(rank)
    figures = {}
    for tokens in sizes:
        ids = torch.randint(0, NUM_EXPERTS, (tokens, TOP_K), generator=generator, dtype=torch.int32)
        payloads = [torch.randn(tokens, HIDDEN, generator=generator).to(torch.bfloat16), ids,
                    torch.rand(tokens, TOP_K, generator=generator)]

        def bare() -> None:
            received = backend.dispatch(ids, payloads, tokens)
            backend.combine(received[0], tokens)

        def wrapped() -> None:
            received = instrumented.dispatch(ids, payloads, tokens)
            instrumented.combine(received[0], tokens)

        timings = {"bare": [], "instrumented": []}
        for iteration in range(warmup + iterations):
            order = (("bare", bare), ("instrumented", wrapped))
            for name, step in order if iteration % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                step()
                elapsed = time.perf_counter() - start
                if iteration >= warmup:
                    timings[name].append(elapsed)
        figures[tokens] = timings

    # The counter updates alone, without communication (what the wrapper adds per step).
    send, recv = backend.send_counts, backend.recv_counts
    for _ in range(warmup):
        counters.record_step(cap)
        counters.record_dispatch(send, recv)
    start = time.perf_counter()
    repeats = 20 * iterations
    for _ in range(repeats):
        counters.record_step(cap)
        counters.record_dispatch(send, recv)
    update_us = (time.perf_counter() - start) / repeats * 1e6
    return {"timings": figures, "counter_update_us": update_us}


def run(quick: bool = False) -> dict:
    from capwatch.demo.ranks import spawn_ranks

    iterations, warmup = (40, 5) if quick else (300, 20)
    results = spawn_ranks(WORLD_SIZE, _rank, TOKEN_SIZES, iterations, warmup, timeout_s=600)
    per_size = {}
    for tokens in TOKEN_SIZES:
        # A step ends when its slowest rank does: take the per-iteration max over ranks.
        bare = [max(rank["timings"][tokens]["bare"][i] for rank in results) for i in range(iterations)]
        inst = [max(rank["timings"][tokens]["instrumented"][i] for rank in results) for i in range(iterations)]
        bare_median, inst_median = statistics.median(bare), statistics.median(inst)
        per_size[str(tokens)] = {
            "bare_median_us": round(bare_median * 1e6, 1),
            "instrumented_median_us": round(inst_median * 1e6, 1),
            "ratio": round(inst_median / bare_median, 4),
            # Each instrumented step against the bare step next to it: less sensitive to drift.
            "paired_ratio": round(statistics.median(i / b for i, b in zip(inst, bare)), 4),
        }
    median_ratio = statistics.median(entry["ratio"] for entry in per_size.values())
    counter_update_us = statistics.median(rank["counter_update_us"] for rank in results)
    # The counter kernels timed alone, as a share of the bare step: immune to the step-to-step
    # noise of a shared machine, which is larger than the overhead itself.
    for entry in per_size.values():
        entry["counter_share"] = round(counter_update_us / entry["bare_median_us"], 4)
    return {
        "benchmark": "dispatch_overhead",
        "backend": f"torch.distributed gloo, {WORLD_SIZE} processes, CPU",
        "hidden": HIDDEN,
        "top_k": TOP_K,
        "num_experts": NUM_EXPERTS,
        "iterations": iterations,
        "per_size": per_size,
        "median_ratio": round(median_ratio, 4),
        "goal_ratio": GOAL_RATIO,
        "meets_goal": median_ratio <= GOAL_RATIO,
        "counter_update_us": round(counter_update_us, 2),
    }


def render(figures: dict) -> None:
    print(f"{figures['backend']}, hidden {figures['hidden']}, top_k {figures['top_k']}, "
          f"{figures['iterations']} interleaved iterations")
    print(f"{'tokens':>7} {'bare us':>10} {'instr. us':>10} {'ratio':>7} {'paired':>7} {'counters':>9}")
    for tokens, entry in figures["per_size"].items():
        print(f"{tokens:>7} {entry['bare_median_us']:>10} {entry['instrumented_median_us']:>10} "
              f"{entry['ratio']:>7} {entry['paired_ratio']:>7} {entry['counter_share']:>9.2%}")
    verdict = "meets" if figures["meets_goal"] else "misses"
    print(f"median ratio {figures['median_ratio']} ({verdict} the goal <= {figures['goal_ratio']}); "
          f"counter updates alone {figures['counter_update_us']} us per step")


if __name__ == "__main__":
    standalone("python -m benchmarks.dispatch_overhead", __doc__, run, render)
