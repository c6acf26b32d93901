"""What each rank process of the end-to-end test runs: the instrumented dispatcher over the torch (gloo)
backend, with the rank's real exporter and reporter, stepping until the parent drops a stop file (or, for one rank, an
exporter-close file: the rank keeps stepping but stops answering scrapes).

Every step is a real dispatch -> expert -> combine through ``InstrumentedDispatcher.run``; the R schedule is
the same on every rank (as in SGLang, R is the group-wide max), and every 15th step needs more than the cap,
so the chunked overflow path and its counters run for real too.

``a2a_backend="deepep"`` runs the same steps as a DeepEP group reports them (its config names DeepEP, its buffer
priced at DeepSeek-V3's hidden size), so one Prometheus, one set of rules and one service see both backends.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.instrumented import InstrumentedDispatcher
from capwatch.dispatcher.torch_backend import TorchA2ABackend
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import custom_geometry
from capwatch.telemetry.exporter import ExporterOptions
from capwatch.telemetry.rank import RankTelemetry, rank_config
from capwatch.backends.deepep import DeepEPBuffer
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import ReporterOptions

CAP = 64
HIDDEN = 16
NUM_EXPERTS = 8
TOP_K = 2
STEP_PAUSE_S = 0.05
OVERFLOW_EVERY = 15
DEEPEP_HIDDEN = 7168  # what a DeepEP rank's buffer is priced at (the steps move HIDDEN-wide rows)


def port_file_name(rank: int, a2a_backend: str) -> str:
    return f"rank{rank}" if a2a_backend == "flashinfer" else f"{a2a_backend}-rank{rank}"


def _config(world_size: int, a2a_backend: str):
    if a2a_backend == "deepep":
        plan = plan_deepep_buffer(custom_geometry(DEEPEP_HIDDEN, TOP_K, NUM_EXPERTS), world_size, CAP, "low_latency")
        return rank_config(cap=CAP, ep_size=world_size, hidden_size=DEEPEP_HIDDEN, top_k=TOP_K,
                           num_experts=NUM_EXPERTS, backend="torch", overflow_policy="chunk", a2a_backend="deepep",
                           deepep=DeepEPBuffer(mode="low_latency", buffer_experts=plan.buffer_experts),
                           allocated_workspace_bytes=plan.buffer_bytes_per_rank)
    return rank_config(cap=CAP, ep_size=world_size, hidden_size=HIDDEN, top_k=TOP_K, num_experts=NUM_EXPERTS,
                       backend="torch", payload_format="fp16", overflow_policy="chunk")


def runtime_tokens(step: int) -> int:
    """R of a step, identical on every rank."""
    if step % OVERFLOW_EVERY == OVERFLOW_EVERY // 2:
        return CAP + CAP // 4  # two chunked rounds
    return random.Random(step).randint(CAP // 8, CAP - CAP // 8)


def local_tokens(step: int, rank: int, world_size: int, runtime: int) -> int:
    """One rank per step holds exactly R tokens (R is the max); the others hold up to R."""
    if rank == step % world_size:
        return runtime
    return random.Random(step * 131 + rank).randint(0, runtime)


def serve_rank(rank: int, world_size: int, cluster: str, service_url: str, run_dir: str, max_seconds: float,
               a2a_backend: str = "flashinfer") -> dict:
    run_path = Path(run_dir)
    name = port_file_name(rank, a2a_backend)
    backend = TorchA2ABackend(NUM_EXPERTS, TOP_K)
    counters = DispatchCounters(CAP, world_size, role="target")
    dispatcher = InstrumentedDispatcher(backend, counters, CAP, overflow_policy="chunk")
    identity = RankIdentity(cluster=cluster, ep_rank=rank, ep_size=world_size, role="target",
                            boot_id=uuid.uuid4().hex)
    config = _config(world_size, a2a_backend)
    telemetry = RankTelemetry(
        counters, identity, config,
        exporter=ExporterOptions(base_port=0),  # the OS picks a free port; the parent reads it below
        reporter=ReporterOptions(service_url=service_url, interval_s=1.0),
    ).start()
    dispatcher.on_overflow.append(telemetry.on_overflow)
    port_file = run_path / f"{name}.port"
    port_file.with_suffix(".tmp").write_text(str(telemetry.exporter.port))
    port_file.with_suffix(".tmp").rename(port_file)  # atomic: the parent never reads half a number

    generator = torch.Generator().manual_seed(rank)
    deadline = time.monotonic() + max_seconds
    stop = torch.zeros(1, dtype=torch.int32)
    step = 0
    try:
        while True:
            # Every rank must run the same number of collectives: agree on stopping first.
            stop.fill_(int((run_path / "stop").exists() or time.monotonic() > deadline))
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
            if telemetry.exporter.port is not None and (run_path / f"{name}.close-exporter").exists():
                telemetry.exporter.close()  # the test's "lost rank": it stops answering scrapes
            runtime = runtime_tokens(step)
            tokens = local_tokens(step, rank, world_size, runtime)
            ids = torch.randint(0, NUM_EXPERTS, (tokens, TOP_K), generator=generator, dtype=torch.int32)
            hidden = torch.randn(tokens, HIDDEN, generator=generator).half()
            output = dispatcher.run(ids, [hidden, ids], runtime, lambda received: received[0],
                                    invalid_token_expert_id=-1, expert_id_payload_index=1)
            assert output.shape == (tokens, HIDDEN)
            step += 1
            time.sleep(STEP_PAUSE_S)
    finally:
        telemetry.close()
    snapshot = counters.snapshot()
    return {"steps": step, "forward_steps": snapshot.forward_steps,
            "overflow_events": dict(snapshot.overflow_events)}
