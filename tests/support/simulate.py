"""Reports of simulated ranks (valid ``RankReport`` JSON), for tests, benchmarks and demos without GPUs.

Each ``SimulatedRank`` keeps its own boot id, sequence and cumulative counters, exactly as a real
reporter would, so the service sees the same stream it gets from a real deployment.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token


@dataclass
class SimulatedRank:
    cluster: str
    ep_rank: int
    ep_size: int
    cap: int
    hidden_size: int = 7168
    top_k: int = 8
    num_experts: int = 256
    payload_format: str = "bf16"
    cuda_graph_max_batch_size: int | None = None
    speculative_tokens: int = 0
    role: str = "target"
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    workspace_multiplier: int = 1  # ep_size reproduces the double-counted workspace bug
    sequence: int = 0
    forward_steps: int = 0
    dispatch_calls: int = 0
    max_runtime_tokens: int = 0
    overflow_totals: dict = field(default_factory=dict)

    def config(self) -> dict:
        dispatch = dispatch_bytes_per_token(self.hidden_size, self.top_k, self.payload_format)
        combine = combine_bytes_per_token(self.hidden_size)
        workspace = workspace_bytes_per_rank(self.ep_size, self.cap * self.workspace_multiplier, dispatch, combine)
        config = {
            "cap": self.cap, "hidden_size": self.hidden_size, "top_k": self.top_k, "num_experts": self.num_experts,
            "payload_format": self.payload_format, "backend": "simulated", "flashinfer_version": "0.7.2.post1",
            "overflow_policy": "raise", "dispatch_bytes_per_token": dispatch, "combine_bytes_per_token": combine,
            "workspace_bytes_per_rank": workspace, "speculative_tokens": self.speculative_tokens,
        }
        if self.cuda_graph_max_batch_size is not None:
            config["cuda_graph_max_batch_size"] = self.cuda_graph_max_batch_size
        return config

    def restart(self) -> None:
        """A new process: new boot id, counters from zero (the service must not double count)."""
        self.boot_id = uuid.uuid4().hex
        self.sequence = 0
        self.forward_steps = self.dispatch_calls = self.max_runtime_tokens = 0
        self.overflow_totals = {}

    def report(self, start_unix_s: float, end_unix_s: float, runtime_tokens: list[int],
               layers: int = 4, local_tokens: list[int] | None = None) -> dict:
        """The next report: one interval in which the steps ran with these R values (and, when given,
        this rank's own local batches: the interval then carries their max, ``max_local_tokens``)."""
        histogram: dict[int, int] = {}
        overflows = 0
        for value in runtime_tokens:
            histogram[min(value, self.cap + 1)] = histogram.get(min(value, self.cap + 1), 0) + 1
            overflows += value > self.cap
        peak = max(runtime_tokens, default=0)
        self.forward_steps += len(runtime_tokens)
        self.dispatch_calls += len(runtime_tokens) * layers
        self.max_runtime_tokens = max(self.max_runtime_tokens, peak)
        interval_overflow = []
        if overflows:
            interval_overflow = [{"kind": "runtime_over_cap", "outcome": "raised", "count": overflows}]
            self.overflow_totals["runtime_over_cap"] = self.overflow_totals.get("runtime_over_cap", 0) + overflows
        report = {
            "schema_version": 1,
            "identity": {"cluster": self.cluster, "ep_rank": self.ep_rank, "ep_size": self.ep_size, "role": self.role,
                         "boot_id": self.boot_id, "host": f"node{self.ep_rank // 8}"},
            "sequence": self.sequence,
            "sent_unix_s": end_unix_s,
            "config": self.config(),
            "counters": {
                "dispatch_calls": self.dispatch_calls, "forward_steps": self.forward_steps,
                "tokens_sent": self.forward_steps * 100, "tokens_received": self.forward_steps * 100,
                "max_runtime_tokens": self.max_runtime_tokens,
                "overflow_events": [{"kind": kind, "outcome": "raised", "count": count}
                                    for kind, count in sorted(self.overflow_totals.items())],
            },
            "interval": {
                "start_unix_s": start_unix_s, "end_unix_s": end_unix_s, "forward_steps": len(runtime_tokens),
                "dispatch_calls": len(runtime_tokens) * layers, "peak_runtime_tokens": peak,
                "runtime_tokens_histogram": [[value, count] for value, count in sorted(histogram.items())],
                "overflow_events": interval_overflow,
            },
        }
        if local_tokens is not None:
            report["interval"]["max_local_tokens"] = max(local_tokens, default=0)
        self.sequence += 1
        return report
