"""One EP rank of ``capwatch demo``: a real process in a torch.distributed (gloo) group that
replays its share of the workload through the instrumented dispatcher, with the per-rank
exporter and the reporter on — wired as ``telemetry/rank.py`` tells a deployment to, except that
the reports are cut and dated on the replay's own clock (``capwatch.demo.replay_clock``).

Runs under ``capwatch.demo.ranks.spawn_ranks``; talks to the parent only through its
``capwatch.demo.progress.RankProgress`` record, never on the hot path beyond one store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from capwatch.demo.progress import Phase, RankProgress
from capwatch.demo.replay_clock import REPORT_INTERVAL_S, ReplayClock, ReplayReading


@dataclass(frozen=True)
class RankPlan:
    """Everything a rank needs, picklable (it crosses the spawn boundary)."""

    cluster: str
    token_counts: list[list[int]]  # [steps][ranks]
    clock: ReplayClock  # when each step happens: pacing, report cuts and report dates
    cap: int
    overflow_policy: str
    model: str
    hidden_size: int  # what the CPU tensors carry
    priced_hidden_size: int  # what the reports price the workspace with (the real model)
    num_experts: int
    top_k: int
    moe_layers: int
    zipf_exponent: float
    service_url: str
    metrics_base_port: int | None  # None: no exporter
    hold_s: float
    seed: int = 0
    bearer_token: str | None = None  # the service's CAPWATCH_TOKEN, when it requires one


def _routing_pool(plan: RankPlan, rank: int, pool_tokens: int):
    """Token -> top-k experts for a pool of tokens, Zipf over experts (the same popularity on every
    rank: hot experts are hot everywhere), plus hidden states and router weights."""
    import torch

    from capwatch.demo.workload import expert_popularity

    generator = torch.Generator().manual_seed(plan.seed * 1000 + rank)
    popularity = torch.tensor(expert_popularity(plan.num_experts, plan.zipf_exponent, seed=plan.seed))
    experts = torch.multinomial(popularity.expand(pool_tokens, -1), plan.top_k, replacement=False,
                                generator=generator).to(torch.int32)
    hidden = torch.randn(pool_tokens, plan.hidden_size, generator=generator).to(torch.bfloat16)
    weights = torch.softmax(torch.randn(pool_tokens, plan.top_k, generator=generator), dim=-1)
    return experts, hidden, weights


def _expert_fn(plan: RankPlan, rank: int, ep_size: int):
    """A cheap stand-in for this rank's experts: one [H, H] matmul scaled by the router weight of
    the slots that chose a local expert (so combine sums real per-token contributions)."""
    import torch

    from capwatch.dispatcher.backend import local_expert_range

    local = local_expert_range(rank, plan.num_experts, ep_size)
    projection = (torch.randn(plan.hidden_size, plan.hidden_size,
                              generator=torch.Generator().manual_seed(rank)) / plan.hidden_size**0.5).to(torch.bfloat16)

    def compute(received):
        x, ids, weights = received
        is_local = (ids >= local.start) & (ids < local.stop)
        coefficient = (weights * is_local).sum(-1, keepdim=True).to(torch.bfloat16)
        return coefficient * (x @ projection)

    return compute


def _wait_for_step(clock: ReplayClock, step: int, started: float, reading: ReplayReading, reporter) -> None:
    """Sleep until ``step`` is due (never ahead of the wall clock). A long pause in a trace still sends
    a report every REPORT_INTERVAL_S, dated within the pause and holding no step, so the service sees
    the rank alive and idle."""
    while (delay := started + clock.offset_s(step) - time.monotonic()) > 0:
        time.sleep(min(delay, REPORT_INTERVAL_S))
        if delay > REPORT_INTERVAL_S:
            reading.idle_until(min(clock.date(step), clock.origin_unix_s + time.monotonic() - started))
            reporter.cut_interval()


def run_rank(rank: int, world_size: int, plan: RankPlan, progress=None) -> dict:
    """The body of one rank process. Returns how it ended; an overflow under the ``raise`` policy
    is returned as ``{"overflow": message}`` after the final report went out. ``progress``: the
    shared records (``capwatch.demo.progress.shared_progress``), or None."""
    import torch

    from capwatch.dispatcher.counters import DispatchCounters
    from capwatch.dispatcher.instrumented import CapOverflowError, InstrumentedDispatcher
    from capwatch.dispatcher.torch_backend import TorchA2ABackend
    from capwatch.telemetry.exporter import ExporterOptions
    from capwatch.telemetry.rank import RankTelemetry, rank_config
    from capwatch.telemetry.report import RankIdentity
    from capwatch.telemetry.reporter import ReporterOptions, new_boot_id

    backend = TorchA2ABackend(plan.num_experts, plan.top_k)
    counters = DispatchCounters(plan.cap, world_size, role="target")
    # Every MoE layer shares the rank's counters; layer 0 leads the step, so a step counts once.
    layers = [InstrumentedDispatcher(backend, counters, plan.cap, overflow_policy=plan.overflow_policy,
                                     step_leader=(layer == 0)) for layer in range(plan.moe_layers)]
    identity = RankIdentity(cluster=plan.cluster, ep_rank=rank, ep_size=world_size, role="target",
                            boot_id=new_boot_id())
    config = rank_config(cap=plan.cap, ep_size=world_size, hidden_size=plan.priced_hidden_size, top_k=plan.top_k,
                         num_experts=plan.num_experts, backend="torch-gloo", overflow_policy=plan.overflow_policy)
    exporter = (ExporterOptions(base_port=plan.metrics_base_port, local_rank=rank)
                if plan.metrics_base_port is not None else None)
    reading = ReplayReading(plan.clock)
    telemetry = RankTelemetry(counters, identity, config, exporter=exporter,
                              reporter=ReporterOptions(service_url=plan.service_url, interval_s=None,
                                                       bearer_token=plan.bearer_token),
                              final_report_timeout_s=10.0, clock=reading).start()
    final_sent = False

    def send_final(reason: str) -> None:
        """Exactly one final report per rank: the reporter stops cutting intervals first, so nothing
        follows it (``RankTelemetry.on_overflow`` would let reporting resume, as a rank that survives
        its error should; this rank stops)."""
        nonlocal final_sent
        if not final_sent:
            final_sent = True
            telemetry.reporter.close(reason, timeout_s=10.0)

    for layer in layers:  # the final report before a raise ends the rank
        layer.on_overflow.append(lambda event: send_final(event.message) if event.outcome == "raised" else None)

    max_local = max((step[rank] for step in plan.token_counts), default=0)
    pool_tokens = max(1, min(max_local, 16_384))
    experts, hidden, weights = _routing_pool(plan, rank, pool_tokens)
    expert_fn = _expert_fn(plan, rank, world_size)
    outcome: dict = {"rank": rank, "steps": 0, "metrics_url": telemetry.metrics_url}
    record = progress[rank] if progress is not None else RankProgress()
    record.phase = Phase.RUNNING
    started = time.monotonic()
    try:
        for step, tokens in enumerate(plan.token_counts):
            _wait_for_step(plan.clock, step, started, reading, telemetry.reporter)
            reading.at_step(step)
            local = tokens[rank]
            runtime_max_tokens = max(max(tokens), 1)  # R: every rank knows every batch size (DP attention)
            offset = (step * 7919) % max(1, pool_tokens - min(local, pool_tokens) + 1)
            index = torch.arange(offset, offset + local) % pool_tokens
            payloads = [hidden[index], experts[index], weights[index]]
            for layer in layers:
                output = layer.run(experts[index], payloads, runtime_max_tokens, expert_fn)
                payloads[0] = output
            outcome["steps"] = step + 1
            if plan.clock.report_after(step):
                telemetry.reporter.cut_interval()
            record.steps_done = step + 1
            if step % 25 == 0:
                record.overflow_events = counters.snapshot().overflow_events_total
    except CapOverflowError as error:
        # on_overflow already shipped the final report (bounded wait) before the raise.
        outcome["overflow"] = str(error)
        record.raised = 1
    outcome["loop_s"] = round(time.monotonic() - started, 3)
    send_final("demo finished")  # already sent when an overflow raised
    snapshot = counters.snapshot()
    outcome.update(forward_steps=snapshot.forward_steps, dispatch_calls=snapshot.dispatch_calls,
                   tokens_sent=snapshot.tokens_sent, max_runtime_tokens=snapshot.max_runtime_tokens,
                   overflow_events=snapshot.overflow_events_total,
                   reports_delivered=telemetry.reporter.stats().delivered)
    stats = telemetry.reporter.stats()
    record.overflow_events = snapshot.overflow_events_total
    record.reports_lost = stats.pending + stats.rejected
    record.reports_merged = stats.merged
    record.phase = Phase.REPORTED
    if plan.hold_s > 0 and "overflow" not in outcome:
        time.sleep(plan.hold_s)  # keep /metrics up for a look or a scrape
    telemetry.close(final_reason=None)  # the final report went out above
    record.phase = Phase.FINISHED
    return outcome
