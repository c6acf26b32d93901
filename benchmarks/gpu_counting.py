"""The plugin's counting on a GPU: bare vs counted, eagerly and inside a CUDA graph, with a control; counts checked.

The product's own counting (``dispatcher.counting.LayerCounting`` over one role's ``DispatchCounters``, its layers
elected as the SGLang session elects them: the step leader, the traffic sample) around a FlashInfer-shaped stand-in
transport on one device (dispatch = 2 launches: payload rows into the layer's workspace and its int32 counter
words; combine = 1 launch), DeepSeek-V3 decode geometry (EP 8, hidden 7168, 128 tokens, cap 1024, 58 MoE layers).
Built from the reference measurement of issue #33 (``shared/gpu/plugin_counting.py``), measured the same way:

- eager: host microseconds per dispatch + combine (launch-bound loop, one sync at the end) of the bare transport, of
  the counted one as a layer outside the traffic sample, as a sampled layer and as the step leader, and of the bare
  transport again (the control), interleaved in rounds; the torch ops one counted call runs, per kind of layer;
- captured (CUDA only): one decode step's 58 layers captured in one CUDA graph, bare and counted, GPU microseconds
  per replay (events), interleaved in rounds with the bare graph again as the control; added per MoE layer;
- exact: after the eager calls and after the replays, the counters' calls, steps and tokens equal what ran;
- no host sync on the counted eager path (CUDA: sync debug mode "error");
- snapshot: host microseconds per ``snapshot()`` on the calling (telemetry) thread, on CUDA while the GPU replays a
  step, and of its part that holds the GIL (all but the device copy and its wait, which lets the GIL go).

Goals (issue #33): <= 0.3 us of GPU time per MoE layer captured; eagerly <= 10 us of host time added and at most one
device op per counted call.

    python -m benchmarks gpu_counting [--quick] [--json]     # on a machine with a CUDA GPU
    python -m benchmarks gpu_counting --smoke               # anywhere: a few calls on CPU (figures meaningless)

Without a GPU and without ``--smoke`` it says so and measures nothing.
"""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.standalone import standalone

EP, HIDDEN, TOKENS, CAP, LAYERS = 8, 7168, 128, 1024, 58
SMOKE_HIDDEN = 64  # on CPU: 58 workspaces of EP x CAP rows stay small
GOAL_GRAPH_US_PER_LAYER = 0.3
GOAL_EAGER_ADDED_US = 10.0
GOAL_EAGER_OPS = 1
# (rounds, eager calls per round, replays per round, snapshots)
FULL, QUICK, SMOKE = (7, 2000, 50, 200), (3, 500, 20, 100), (2, 5, 2, 5)


class StandIn:
    """One layer's FlashInfer-shaped transport: its workspace and its int32 send/receive counter words."""

    def __init__(self, torch, device, sent_per_rank: int, hidden: int):
        self.workspace = torch.empty(EP * CAP, hidden, dtype=torch.bfloat16, device=device)
        self.words = torch.zeros(2, EP, dtype=torch.int32, device=device)
        self.sent = torch.full((2, EP), sent_per_rank, dtype=torch.int32, device=device)
        self.out = torch.empty(TOKENS, hidden, dtype=torch.bfloat16, device=device)

    def dispatch(self, ids, payloads, runtime_max_tokens_per_rank, invalid=None, index=None):
        self.workspace[: ids.shape[0]].copy_(payloads[0])
        self.words.copy_(self.sent)
        return self.workspace

    def combine(self, payload, runtime_max_tokens_per_rank):
        self.out.copy_(payload[:TOKENS])
        return self.out


def _median_us(values) -> float:
    return round(statistics.median(values) * 1e6, 3)


def run(quick: bool = False, smoke: bool = False) -> dict:
    import torch
    from capwatch.dispatcher.counters import DispatchCounters, pause_snapshots
    from capwatch.dispatcher.counting import TRAFFIC_SAMPLE_STRIDE, CounterWords, LayerCounting, elect

    cuda = torch.cuda.is_available()
    if not cuda and not smoke:
        return {"benchmark": "gpu_counting", "skipped": "no CUDA device: run it on a GPU, or --smoke to exercise it "
                "on CPU (figures meaningless there)"}
    device = torch.device("cuda" if cuda and not smoke else "cpu")
    rounds, calls, replays, snapshots = SMOKE if smoke else QUICK if quick else FULL
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = {"benchmark": "gpu_counting", "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "smoke": smoke,
           "geometry": dict(ep_size=EP, hidden=SMOKE_HIDDEN if smoke else HIDDEN, tokens=TOKENS, cap=CAP,
                            layers=LAYERS),
           "traffic_sample_stride": TRAFFIC_SAMPLE_STRIDE}

    sent_per_rank = TOKENS // EP
    ids = torch.zeros(TOKENS, 8, dtype=torch.int32, device=device)
    width = SMOKE_HIDDEN if smoke else HIDDEN
    hidden = torch.randn(TOKENS, width, device=device).to(torch.bfloat16)
    payloads = [hidden, ids]
    counters = DispatchCounters(CAP, EP, device, role="target")
    standins = [StandIn(torch, device, sent_per_rank, width) for _ in range(LAYERS)]
    layers = [LayerCounting(counters, 0, EP, CounterWords(s.words)) for s in standins]
    elect(counters, layers, list(range(LAYERS)), TRAFFIC_SAMPLE_STRIDE)  # as the session elects a role's layers
    sampled = [i for i, layer in enumerate(layers) if layer.counts_traffic]
    out["sampled_layers"] = sampled
    bare = [s.dispatch for s in standins]
    counted = [layer.counted(s.dispatch) for layer, s in zip(layers, standins)]
    kinds = {"other": 1, "sampled": sampled[1] if len(sampled) > 1 else 0, "leader": 0}

    def eager_loop(dispatch, combine, n):
        sync()
        started = time.perf_counter()
        for _ in range(n):
            combine(dispatch(ids, payloads, TOKENS), TOKENS)
        ended = time.perf_counter()
        sync()
        return (ended - started) / n

    # --- eager: host time, interleaved rounds, a bare control --------------------------------------------
    for dispatch in (bare[1], *(counted[i] for i in kinds.values())):
        eager_loop(dispatch, standins[1].combine, max(calls // 10, 2))  # warm-up (the step's host views too)
    before = counters.snapshot()
    sides = {"bare": bare[1], **{f"counted_{kind}": counted[i] for kind, i in kinds.items()}, "bare_control": bare[1]}
    eager = {side: [] for side in sides}
    for _ in range(rounds):
        for side, dispatch in sides.items():
            eager[side].append(eager_loop(dispatch, standins[kinds.get(side.removeprefix("counted_"), 1)].combine,
                                          calls))
    after = counters.snapshot()
    medians = {side: _median_us(values) for side, values in eager.items()}
    out["eager_us_per_call_median"] = medians
    out["eager_added_us"] = {kind: round(medians[f"counted_{kind}"] - medians["bare"], 3) for kind in kinds}
    out["eager_added_us"]["control"] = round(medians["bare_control"] - medians["bare"], 3)
    counted_calls = rounds * calls
    expected_sent = counted_calls * sum(1 for i in kinds.values() if layers[i].counts_traffic) * sent_per_rank * EP
    out["eager_counts"] = {
        "dispatch_calls": after.dispatch_calls - before.dispatch_calls, "expected_calls": 3 * counted_calls,
        "forward_steps": after.forward_steps - before.forward_steps, "expected_steps": counted_calls,
        "tokens_sent": after.tokens_sent - before.tokens_sent, "expected_tokens_sent": expected_sent}
    out["eager_ops_per_call"] = {kind: _ops(counted[i], bare[i], ids, payloads) for kind, i in kinds.items()}

    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(20):
                for i in kinds.values():
                    standins[i].combine(counted[i](ids, payloads, TOKENS), TOKENS)
            out["no_host_sync"] = "ok: counted calls of every kind under sync debug mode 'error'"
        except Exception as error:  # noqa: BLE001 - the figure says what failed
            out["no_host_sync"] = f"FAILED: {type(error).__name__}: {error}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out.update(_captured(torch, counters, standins, bare, counted, layers, ids, payloads, rounds, replays,
                             sent_per_rank, pause_snapshots))
    out["snapshot"] = _snapshots(counters, standins, counted, ids, payloads, snapshots, device, sync)
    out["exact"] = _exact(out)
    out["meets_goal"] = _meets_goal(out)
    return out


VIEWS = {"aten::slice", "aten::select", "aten::view", "aten::as_strided", "aten::alias", "aten::flatten"}


def _top_level_ops(call) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        call()
    return sorted(event.name for event in profiler.events() if event.cpu_parent is None and event.name not in VIEWS)


def _ops(counted, bare, ids, payloads) -> list[str]:
    """The top-level torch ops one eager counted call dispatches beyond its bare transport's (views apart: a view
    launches nothing): the device ops the counting adds to the call."""
    added = _top_level_ops(lambda: counted(ids, payloads, TOKENS))
    for op in _top_level_ops(lambda: bare(ids, payloads, TOKENS)):
        added.remove(op)
    return added


def _captured(torch, counters, standins, bare, counted, layers, ids, payloads, rounds, replays, sent_per_rank,
              pause_snapshots) -> dict:
    """One decode step's layers captured in one graph, bare and counted; GPU time per replay, interleaved."""
    def step(dispatches):
        for index, dispatch in enumerate(dispatches):
            standins[index].combine(dispatch(ids, payloads, TOKENS), TOKENS)

    graphs, stream = {}, torch.cuda.Stream()
    for name, dispatches in (("bare", bare), ("counted", counted)):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step(dispatches)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with pause_snapshots(counters), torch.cuda.graph(graph):
            step(dispatches)
        graphs[name] = graph
    torch.cuda.synchronize()
    before = counters.snapshot()

    def replay_us(graph, n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / n

    for graph in graphs.values():
        replay_us(graph, 10)
    times = {"bare": [], "counted": [], "bare_control": []}
    for _ in range(rounds):
        times["bare"].append(replay_us(graphs["bare"], replays))
        times["counted"].append(replay_us(graphs["counted"], replays))
        times["bare_control"].append(replay_us(graphs["bare"], replays))
    torch.cuda.synchronize()
    after = counters.snapshot()
    medians = {name: statistics.median(values) for name, values in times.items()}
    counted_replays = 10 + rounds * replays
    sampled = sum(layer.counts_traffic for layer in layers)
    return {
        "graph_us_per_step_median": {name: round(value, 3) for name, value in medians.items()},
        "graph_added_us_per_layer": round((medians["counted"] - medians["bare"]) / LAYERS, 3),
        "graph_ratio": round(medians["counted"] / medians["bare"], 4),
        "graph_control_ratio": round(medians["bare_control"] / medians["bare"], 4),
        "graph_counts": {
            "dispatch_calls": after.dispatch_calls - before.dispatch_calls, "expected_calls": LAYERS * counted_replays,
            "forward_steps": after.forward_steps - before.forward_steps, "expected_steps": counted_replays,
            "tokens_sent": after.tokens_sent - before.tokens_sent,
            "expected_tokens_sent": sampled * counted_replays * sent_per_rank * EP},
    }


def _snapshots(counters, standins, counted, ids, payloads, count, device, sync) -> dict:
    """Host time per ``snapshot()`` on the telemetry thread (on CUDA with the GPU replaying a step), and of its part
    that holds the GIL: all but the device copy and its wait (``_copy_to_host``, which waits without the GIL)."""
    busy = None
    if device.type == "cuda":
        import torch

        graph = torch.cuda.CUDAGraph()
        sync()
        with counters.pause_snapshots(), torch.cuda.graph(graph):
            for index, dispatch in enumerate(counted):
                standins[index].combine(dispatch(ids, payloads, TOKENS), TOKENS)
        busy = graph.replay
    totals, copies = [], []
    for _ in range(count):
        if busy is not None:
            busy()
        started = time.perf_counter()
        counters.snapshot()
        totals.append(time.perf_counter() - started)
        if busy is not None:
            busy()
        started = time.perf_counter()
        counters._copy_to_host()
        copies.append(time.perf_counter() - started)
    sync()
    totals.sort()
    return {"us_median": _median_us(totals),
            "us_p99": round(totals[min(len(totals) - 1, int(0.99 * len(totals)))] * 1e6, 1),
            "copy_and_wait_us_median": _median_us(copies),
            "gil_held_us_median": round(_median_us(totals) - _median_us(copies), 3),
            "gpu_busy": busy is not None}


def _exact(out: dict) -> bool:
    counts = [out["eager_counts"], *([out["graph_counts"]] if "graph_counts" in out else [])]
    return all(entry[name] == entry[expected] for entry in counts for name, expected in (
        ("dispatch_calls", "expected_calls"), ("forward_steps", "expected_steps"), ("tokens_sent", "expected_tokens_sent")))


def _meets_goal(out: dict) -> bool | None:
    if out["smoke"]:
        return None
    eager = max(out["eager_added_us"][kind] for kind in ("other", "sampled", "leader")) <= GOAL_EAGER_ADDED_US
    ops = all(len(ops) <= GOAL_EAGER_OPS for ops in out["eager_ops_per_call"].values())
    graph = out.get("graph_added_us_per_layer", 0) <= GOAL_GRAPH_US_PER_LAYER
    return bool(eager and ops and graph and out["exact"])


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    smoke = "--smoke" in argv
    if smoke:
        argv.remove("--smoke")
    standalone("python -m benchmarks.gpu_counting", __doc__, lambda quick: run(quick, smoke), None, argv)


if __name__ == "__main__":
    main()
