"""The SGLang plugin's cost: a real ``FlashinferDispatcher`` dispatch + combine, bare vs instrumented,
beside a bare-vs-bare control.

Two gloo rank processes of the sglang test venv (``.venv-sglang``, the newest verified release's folder
first on ``PYTHONPATH``; built by ``make test``) publish one SGLang scheduler context each
(``tests/sglang/rank_program.start_rank``: the plugin loaded through its entry point and started by
``configure_scheduler_process``) and build three dispatchers with the same geometry: one adopted by the
plugin (its only layer, so every call is also the step leader's: the most the plugin does per call) and
two handed back as SGLang ships them (``hooks.flashinfer.unadopt``): ``bare`` and the control ``bare2``.
Decode steps rotate between the three. The transport is the tests' MoeAlltoAll stand-in (capwatch's
torch.distributed backend), identical on every side.

Per size: the median wall time of a dispatch + combine (a step ends when its slowest rank does) and
the median CPU time of the calling thread (``time.thread_time``), each for bare, control and plugin, and
the wall ratios plugin/bare and control/bare (the noise) as the median of each rotation's own ratio: the
three sides of one rotation run within milliseconds of each other, so load that changes more slowly
cancels in the pair. The ratio of the medians is reported beside it: it moves by a few percent from run
to run, the control's as much as the plugin's, and hid the plugin's 2-3 % in that noise.

The stand-in moves the payload through the CPU's caches (FlashInfer's transport runs on the GPU), and
its gloo collective puts the thread to sleep while other jobs run: the plugin's ops right after it run
cold (the first int64 ``add_`` after the stand-in's dispatch takes 7-15 us, whoever's it is). So the
benchmark also times the plugin's ops as the step leader back to back and right after a 1 ms wait on an
event (``plugin_ops_leader``), and measures the plugin's own cost apart (``hot_path``): SGLang's real
dispatch + combine with the transport a no-op on every side, the plugin as its role's step leader and as
any other layer, beside the control. And it profiles the plugin's counting where it is paid (``in_run``): real
dispatch + combine calls through the product's counting dispatch, rebuilt with a thread clock stamp where its
transport returns and a clock around each of its two counting calls. Goals: <= 10 us of host time added per call
(the larger hot-path figure), median wall ratio <= 1.02 (paired).

    python -m benchmarks.sglang_dispatch [--quick] [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.standalone import standalone

TOKEN_SIZES = (1, 8, 32, 128)  # decode batches per DP rank
MODEL = {"hidden_size": 1024, "top_k": 8, "num_experts": 16}
WORLD_SIZE = 2
GOAL_RATIO = 1.02
GOAL_ADDED_US = 10.0
SIDES = ("bare", "bare2", "plugin")


def _rank(run_dir: Path, rank: int) -> None:
    import torch
    from capwatch.sglang_plugin.hooks.flashinfer import unadopt
    from sglang.srt.layers.dp_attention import set_dp_buffer_len
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    from tests.sglang.rank_program import start_rank

    torch.set_num_threads(1)  # two ranks on a small machine: no intra-op threads fighting gloo's
    plan = json.loads((run_dir / "plan.json").read_text())
    sglang = start_rank(plan, rank)
    dispatchers = {"plugin": sglang.build(0), "bare": sglang.build(1), "bare2": sglang.build(2)}
    unadopt(dispatchers["bare"])  # SGLang's dispatcher and MoeAlltoAll as shipped
    unadopt(dispatchers["bare2"])

    generator = torch.Generator().manual_seed(rank)
    wall, host = {}, {}
    for tokens in plan["sizes"]:
        set_dp_buffer_len(tokens * WORLD_SIZE, tokens, False, [tokens] * WORLD_SIZE)
        x = torch.randn(tokens, MODEL["hidden_size"], generator=generator).to(torch.bfloat16)
        ids = torch.randint(0, MODEL["num_experts"], (tokens, MODEL["top_k"]), generator=generator, dtype=torch.int32)
        topk = StandardTopKOutput(torch.rand(tokens, MODEL["top_k"], generator=generator), ids, None)
        wall[str(tokens)], host[str(tokens)] = {side: [] for side in SIDES}, {side: [] for side in SIDES}
        for iteration in range(plan["warmup"] + plan["iterations"]):
            shift = iteration % len(SIDES)  # each side goes first, second and third in turn
            for side in SIDES[shift:] + SIDES[:shift]:
                dispatcher = dispatchers[side]
                started, started_cpu = time.perf_counter(), time.thread_time()
                out = dispatcher.dispatch(x, topk)
                dispatcher.combine(sglang.module.FlashinferCombineInput(out.moe_output))
                if iteration >= plan["warmup"]:
                    host[str(tokens)][side].append(time.thread_time() - started_cpu)
                    wall[str(tokens)][side].append(time.perf_counter() - started)
    in_run = _in_run(sglang, dispatchers["plugin"], plan["in_run_calls"])  # both ranks: its dispatches are collective
    after_wait = _after_wait(vars(dispatchers["plugin"].moe_a2a)["dispatch"], plan["after_wait_calls"]) \
        if rank == 0 else None
    hot_path = _hot_path(sglang, dispatchers, plan["hot_path_calls"]) if rank == 0 else None
    (run_dir / f"timings-{rank}.json").write_text(json.dumps({"wall": wall, "host": host, "hot_path": hot_path,
                                                              "after_wait": after_wait, "in_run": in_run}))


def _in_run(sglang, dispatcher, calls: int) -> dict:
    """Host microseconds of each part of the plugin's counting inside real dispatch + combine calls over the
    stand-in (8 tokens): the product's counting dispatch, rebuilt with a clock stamp where its transport returns
    and a clock around each of its two counting calls (the step, on the host; the counter words' ``copy_`` and
    ``add_``), the parts it counts with unchanged. Beside them, the same clock pair with nothing between (its own
    cost, included in each part) and each call timed right after itself (warm): the profile of what the end-to-end
    figure adds. (The back-to-back calls count too; nothing reads these counters.)"""
    import copy

    import torch
    from sglang.srt.layers.dp_attention import set_dp_buffer_len
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    clock = time.thread_time_ns
    parts = {name: [] for name in ("transport_returned_to_step", "step", "counter_words", "clock_pair",
                                   "step_back_to_back", "counter_words_back_to_back")}
    marks = {}

    def timed(name, call):
        def run(*args):
            started = clock()
            call(*args)
            parts[name].append(clock() - started)
        return run

    def transport(*args, **kwargs):
        received = original.transport(*args, **kwargs)
        marks["returned"] = clock()
        return received

    def step(*args):
        parts["transport_returned_to_step"].append(clock() - marks["returned"])
        timed("step", counters.record_step)(*args)

    alltoall = dispatcher.moe_a2a
    original = vars(alltoall)["dispatch"]
    layer, counters = original.counting, original.counting.counters
    # The layer's counting, its two counting calls timed: the step (through its counters) and its dispatch (the
    # call and the counter words: the plugin's only layer is its role's traffic sample).
    proxy = copy.copy(layer)
    proxy.counters, proxy.step_leader = SimpleNamespace(record_step=step), True
    proxy.count_dispatch = timed("counter_words", layer.count_dispatch)
    tokens = 8
    set_dp_buffer_len(tokens * WORLD_SIZE, tokens, False, [tokens] * WORLD_SIZE)
    x = torch.randn(tokens, MODEL["hidden_size"]).to(torch.bfloat16)
    ids = torch.randint(0, MODEL["num_experts"], (tokens, MODEL["top_k"]), dtype=torch.int32)
    topk = StandardTopKOutput(torch.rand(tokens, MODEL["top_k"]), ids, None)
    try:
        alltoall.dispatch = proxy.counted(transport)
        for _ in range(calls):
            out = dispatcher.dispatch(x, topk)
            dispatcher.combine(sglang.module.FlashinferCombineInput(out.moe_output))
            started = clock()
            parts["clock_pair"].append(clock() - started)
            for name, call, args in (("step_back_to_back", counters.record_step, (tokens, tokens)),
                                     ("counter_words_back_to_back", layer.count_dispatch, ())):
                call(*args)  # warm: then timed right after itself
                timed(name, call)(*args)
    finally:
        alltoall.dispatch = original
    return {f"{name}_us": round(statistics.median(values) / 1000, 2) for name, values in parts.items()}


def _after_wait(counted, calls: int) -> dict:
    """Host microseconds of the plugin's per-call counting as the step leader (the step, on the host; the counts'
    ``copy_`` and the record's ``add_``, on the adopted layer's own counter words, into counters of its geometry),
    back to back and right after the calling thread waited 1 ms on an event another thread sets, as the
    stand-in's gloo collective makes it wait just before them. FlashInfer's dispatch is a kernel launch: on a GPU
    the thread does not wait there."""
    import threading

    from capwatch.dispatcher.counters import DispatchCounters

    layer, counter_words = counted.counting, counted.counting.traffic.words
    counters = DispatchCounters(layer.cap, layer.counters.ep_size)
    record = counters.traffic_record()

    def ops() -> None:
        counters.record_step(8, 8)
        counters.record_counter_words(record, counter_words)

    times = {"back_to_back": [], "after_a_wait": []}
    for _ in range(calls):
        for name in times:
            if name == "after_a_wait":
                woken = threading.Event()
                threading.Timer(0.001, woken.set).start()
                woken.wait()
            started = time.thread_time_ns()
            ops()
            times[name].append(time.thread_time_ns() - started)
    return {f"{name}_us": round(statistics.median(values) / 1000, 2) for name, values in times.items()}


def _hot_path(sglang, dispatchers, calls: int) -> dict:
    """Host microseconds per dispatch + combine of SGLang's real dispatcher code with FlashInfer's transport
    replaced by a no-op on every side (the plugin keeps its counting around it): what the plugin's own work
    costs, without the other rank's wait in the figure. The plugin side twice: as its role's step leader
    (the step counted too: on the host, eagerly) and as any other layer."""
    import torch
    from sglang.srt.layers.dp_attention import set_dp_buffer_len
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    tokens, ep_size = 8, WORLD_SIZE
    set_dp_buffer_len(tokens * ep_size, tokens, False, [tokens] * ep_size)
    x = torch.randn(tokens, MODEL["hidden_size"]).to(torch.bfloat16)
    ids = torch.randint(0, MODEL["num_experts"], (tokens, MODEL["top_k"]), dtype=torch.int32)
    topk = StandardTopKOutput(torch.rand(tokens, MODEL["top_k"]), ids, None)
    received = [torch.zeros(ep_size, tokens, n) for n in (MODEL["hidden_size"], MODEL["top_k"], MODEL["top_k"])]
    payload = torch.zeros(ep_size, tokens, MODEL["hidden_size"], dtype=torch.bfloat16)
    output = torch.zeros(tokens, MODEL["hidden_size"], dtype=torch.bfloat16)

    def transport(*args, **kwargs):
        return received

    for side, dispatcher in dispatchers.items():
        alltoall = dispatcher.moe_a2a
        alltoall.combine = lambda *args, **kwargs: output
        alltoall.get_combine_payload_tensor_in_workspace = lambda *args: payload
        if side == "plugin":  # the counting dispatch, as adoption made it, around the no-op transport
            counted = vars(alltoall)["dispatch"]
            alltoall.dispatch = counted.counting.counted(transport)
        else:
            alltoall.dispatch = transport

    def one(side: str) -> None:
        dispatcher = dispatchers[side]
        out = dispatcher.dispatch(x, topk)
        dispatcher.combine(sglang.module.FlashinferCombineInput(out.moe_output))

    layer = vars(dispatchers["plugin"].moe_a2a)["dispatch"].counting
    figures = {}
    for leader in (True, False):
        layer.step_leader = leader
        times = {side: [] for side in SIDES}
        for iteration in range(calls):
            shift = iteration % len(SIDES)
            for side in SIDES[shift:] + SIDES[:shift]:
                started = time.thread_time_ns()
                one(side)
                times[side].append(time.thread_time_ns() - started)
        medians = {side: statistics.median(values) / 1000 for side, values in times.items()}
        figures["leader" if leader else "other_layer"] = {
            "bare_us": round(medians["bare"], 2), "added_us": round(medians["plugin"] - medians["bare"], 2),
            "control_added_us": round(medians["bare2"] - medians["bare"], 2)}
    return figures


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


# Calls per measurement: (rotated iterations, warm-up, hot path, after a wait, in the run).
FULL, QUICK, SMOKE = (600, 40, 20000, 1000, 1000), (60, 10, 2000, 200, 100), (3, 1, 3, 3, 3)


def run(quick: bool = False, smoke: bool = False) -> dict:
    """``smoke``: a few calls of everything, the ranks forked from the tests' zygotes (the test that keeps this
    benchmark running; its figures mean nothing)."""
    from tests.sglang.ranks import RankRun, sglang_missing

    missing = sglang_missing()
    if missing is not None:
        return {"benchmark": "sglang_dispatch", "skipped": missing}
    iterations, warmup, hot_path_calls, after_wait_calls, in_run_calls = SMOKE if smoke else QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="capwatch-sglang-bench-") as folder:
        run_dir = Path(folder)
        # Fresh interpreters, as SGLang's spawn starts its schedulers: nothing timed runs in a forked copy (a smoke
        # run forks: it times nothing worth reading).
        group = RankRun(run_dir, WORLD_SIZE, {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_METRICS_BASE_PORT": "0"},
                        program="benchmarks.sglang_dispatch", fork=smoke)
        group.start({"model": MODEL, "sizes": list(TOKEN_SIZES), "iterations": iterations, "warmup": warmup,
                     "hot_path_calls": hot_path_calls, "after_wait_calls": after_wait_calls,
                     "in_run_calls": in_run_calls})
        codes = group.wait_exit(timeout_s=1800)
        if codes != [0] * WORLD_SIZE:
            raise RuntimeError(f"benchmark ranks failed: {codes}\n{group.logs()}")
        results = [json.loads((run_dir / f"timings-{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
        release = group.sglang_release
    per_size = {}
    for tokens in map(str, TOKEN_SIZES):
        # A step ends when its slowest rank does; host time is each rank's own, pooled over the ranks.
        steps = {side: [max(rank["wall"][tokens][side][i] for rank in results) for i in range(iterations)]
                 for side in SIDES}
        wall = {side: statistics.median(times) for side, times in steps.items()}
        host = {side: statistics.median(t for rank in results for t in rank["host"][tokens][side]) for side in SIDES}

        def paired(side: str) -> float:  # each rotation's side against its own bare step
            return round(statistics.median(a / b for a, b in zip(steps[side], steps["bare"])), 4)

        per_size[tokens] = {
            "bare_median_us": _us(wall["bare"]), "control_median_us": _us(wall["bare2"]),
            "plugin_median_us": _us(wall["plugin"]),
            "ratio": paired("plugin"), "control_ratio": paired("bare2"),
            "ratio_of_medians": round(wall["plugin"] / wall["bare"], 4),
            "control_ratio_of_medians": round(wall["bare2"] / wall["bare"], 4),
            "bare_host_us": _us(host["bare"]),
            "added_host_us": _us(host["plugin"] - host["bare"]),
            "control_added_host_us": _us(host["bare2"] - host["bare"]),
        }
    median_ratio = statistics.median(entry["ratio"] for entry in per_size.values())
    hot_path = results[0]["hot_path"]
    added = max(entry["added_us"] for entry in hot_path.values())
    return {
        "benchmark": "sglang_dispatch",
        "backend": f"sglang {release} FlashinferDispatcher, MoeAlltoAll stand-in over gloo, "
                   f"{WORLD_SIZE} processes, CPU",
        **MODEL,
        "iterations": iterations,
        "per_size": per_size,
        "median_ratio": round(median_ratio, 4),
        "median_control_ratio": round(statistics.median(e["control_ratio"] for e in per_size.values()), 4),
        "median_ratio_of_medians": round(statistics.median(e["ratio_of_medians"] for e in per_size.values()), 4),
        "median_control_ratio_of_medians": round(statistics.median(e["control_ratio_of_medians"]
                                                                   for e in per_size.values()), 4),
        "median_added_host_us": round(statistics.median(e["added_host_us"] for e in per_size.values()), 1),
        "median_control_added_host_us": round(statistics.median(e["control_added_host_us"]
                                                                for e in per_size.values()), 1),
        "hot_path": hot_path,
        "plugin_ops_leader": results[0]["after_wait"],
        "in_run": results[0]["in_run"],
        "added_us_per_call": added,
        "goal_ratio": GOAL_RATIO,
        "goal_added_host_us": GOAL_ADDED_US,
        "meets_goal": median_ratio <= GOAL_RATIO and added <= GOAL_ADDED_US,
    }


def render(figures: dict) -> None:
    if "skipped" in figures:
        print(f"skipped: {figures['skipped']}")
        return
    print(f"{figures['backend']}, hidden {figures['hidden_size']}, top_k {figures['top_k']}, "
          f"{figures['iterations']} rotated iterations")
    print(f"{'tokens':>7} {'bare us':>9} {'ctrl us':>9} {'plugin us':>10} {'ratio':>7} {'ctrl':>7} "
          f"{'host us':>8} {'+plugin':>8} {'+ctrl':>7}")
    for tokens, e in figures["per_size"].items():
        print(f"{tokens:>7} {e['bare_median_us']:>9} {e['control_median_us']:>9} {e['plugin_median_us']:>10} "
              f"{e['ratio']:>7} {e['control_ratio']:>7} {e['bare_host_us']:>8} {e['added_host_us']:>8} "
              f"{e['control_added_host_us']:>7}")
    print(f"median wall ratio, paired by rotation, {figures['median_ratio']} (control "
          f"{figures['median_control_ratio']}, goal <= {figures['goal_ratio']}); as a ratio of medians "
          f"{figures['median_ratio_of_medians']} (control {figures['median_control_ratio_of_medians']}); "
          f"end to end, host time added per call "
          f"{figures['median_added_host_us']} us (control {figures['median_control_added_host_us']} us)")
    for name, entry in figures["hot_path"].items():
        print(f"no transport, plugin as {name.replace('_', ' ')}: bare {entry['bare_us']} us, added "
              f"{entry['added_us']} us (control {entry['control_added_us']} us)")
    ops = figures["plugin_ops_leader"]
    print(f"the plugin's ops as step leader: {ops['back_to_back_us']} us back to back, {ops['after_a_wait_us']} us "
          f"right after a 1 ms wait")
    parts = figures["in_run"]
    print(f"inside real calls (rank 0, 8 tokens): {parts['transport_returned_to_step_us']} us from the transport's "
          f"return to the step, step {parts['step_us']} us, counter words {parts['counter_words_us']} us (each with a "
          f"clock pair of {parts['clock_pair_us']} us); warm, back to back: step {parts['step_back_to_back_us']} us, "
          f"counter words {parts['counter_words_back_to_back_us']} us")
    print(f"host time the plugin adds per dispatch + combine: {figures['added_us_per_call']} us "
          f"(goal <= {figures['goal_added_host_us']})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] != "--quick":  # a rank, started by run() in the sglang venv
        _rank(Path(sys.argv[1]), int(sys.argv[2]))
    else:
        standalone("python -m benchmarks.sglang_dispatch", __doc__, run, render)
