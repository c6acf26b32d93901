"""What each rank process runs in the live tests: the real InstrumentedDispatcher on the
torch.distributed (gloo) backend, wired to RankTelemetry exactly as a deployment would, driven
step by step by commands from the test."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.instrumented import InstrumentedDispatcher
from capwatch.dispatcher.torch_backend import TorchA2ABackend
from capwatch.telemetry.exporter import ExporterOptions
from capwatch.telemetry.intervals import coherent
from capwatch.telemetry.rank import RankTelemetry, rank_config
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import ReporterOptions, new_boot_id

from .workload import Workload


@dataclass(frozen=True)
class RankPlan:
    cluster: str
    service_url: str | None
    workload: Workload = Workload()
    interval_s: float = 0.2
    backoff_max_s: float = 0.2
    max_pending_reports: int = 64
    bearer_token: str | None = None
    legacy_cluster_label: bool = False


def serve_rank(rank: int, world_size: int, plan: RankPlan, commands, replies, stop) -> dict:
    workload = plan.workload
    backend = TorchA2ABackend(workload.num_experts, workload.top_k)
    counters = DispatchCounters(workload.cap, world_size)
    layers = [InstrumentedDispatcher(backend, counters, workload.cap, step_leader=layer == 0)
              for layer in range(workload.layers)]

    # --- the wiring a deployment copies -----------------------------------------------------------
    identity = RankIdentity(cluster=plan.cluster, ep_rank=rank, ep_size=world_size, boot_id=new_boot_id())
    config = rank_config(cap=workload.cap, ep_size=world_size, hidden_size=workload.hidden_size,
                         top_k=workload.top_k, num_experts=workload.num_experts, backend="torch-gloo")
    reporter = None if plan.service_url is None else ReporterOptions(
        plan.service_url, interval_s=plan.interval_s, backoff_initial_s=0.05, backoff_max_s=plan.backoff_max_s,
        max_pending_reports=plan.max_pending_reports, request_timeout_s=30.0, bearer_token=plan.bearer_token)
    telemetry = RankTelemetry(counters, identity, config, reporter=reporter,
                              exporter=ExporterOptions(base_port=0, local_rank=rank,
                                                                legacy_group_label=plan.legacy_cluster_label)).start()
    for layer in layers:
        layer.on_overflow.append(telemetry.on_overflow)
    # -------------------------------------------------------------------------------------------------

    step = 0

    def run_step(runtime_tokens: int | None = None) -> None:
        nonlocal step
        runtime_tokens = runtime_tokens or workload.runtime_tokens(world_size, step)
        ids, hidden = workload.experts(rank, step), workload.hidden_states(rank, step)
        for layer in layers:
            layer.run(ids, [hidden], runtime_tokens, expert_fn=lambda received: received[0])
        step += 1

    def status() -> dict:
        reporter_state = None
        if telemetry.reporter is not None:
            reporter_state = dataclasses.asdict(telemetry.reporter.stats())
            reporter_state["next_sequence"] = telemetry.reporter.next_sequence
        return {"rank": rank, "step": step, "boot_id": identity.boot_id, "metrics_url": telemetry.metrics_url,
                "snapshot": dataclasses.asdict(coherent(counters.snapshot())), "reporter": reporter_state}

    replies.put(("ready", status()))
    while True:
        command, argument = commands[rank].get()
        if command == "steps":
            for _ in range(argument):
                run_step()
        elif command == "until":  # run until the test sets `stop`; every rank stops at the same step
            while True:
                flag = torch.tensor([int(stop.is_set())])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if flag.item():
                    break
                run_step()
        elif command == "cut":  # close the reporting interval now (the test drives intervals, not the clock)
            telemetry.reporter.cut_interval()
        elif command == "overflow":  # R past the cap: the raise policy kills this rank
            run_step(workload.cap + argument)
        elif command == "exit":
            telemetry.close(timeout_s=30)
            return status()
        replies.put(("done", status()))
