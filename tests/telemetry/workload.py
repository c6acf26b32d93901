"""A known decode workload: which tokens each rank routes where at every step, and what the
counters must add up to afterwards (computed here without the dispatcher)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Workload:
    cap: int = 48
    max_local_tokens: int = 40  # <= cap: the steady run never overflows
    num_experts: int = 8
    top_k: int = 2
    hidden_size: int = 8
    layers: int = 2  # MoE layers sharing one rank's counters
    seed: int = 7

    def local_tokens(self, rank: int, step: int) -> int:
        """Varies by rank and step; 0 happens (an idle rank still takes part in the collective)."""
        return (rank * 17 + step * 29 + (step * step) % 11) % (self.max_local_tokens + 1)

    def runtime_tokens(self, ep_size: int, step: int) -> int:
        """R of a step: the largest local batch over the group (at least 1)."""
        return max(1, max(self.local_tokens(rank, step) for rank in range(ep_size)))

    def experts(self, rank: int, step: int) -> torch.Tensor:
        """int32 [T, top_k], distinct experts per token."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + rank * 10_007 + step)
        tokens = self.local_tokens(rank, step)
        scores = torch.rand(tokens, self.num_experts, generator=generator)
        return scores.argsort(dim=1)[:, : self.top_k].to(torch.int32)

    def hidden_states(self, rank: int, step: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 7_919 + rank * 101 + step)
        return torch.randn(self.local_tokens(rank, step), self.hidden_size, generator=generator)


@dataclass(frozen=True)
class Expected:
    forward_steps: int
    dispatch_calls: int
    tokens_sent: list[int]  # per rank
    tokens_received: list[int]  # per rank
    runtime_tokens_histogram: dict[int, int]  # R -> steps, same on every rank
    max_runtime_tokens: int


def expected_totals(workload: Workload, ep_size: int, steps: range) -> Expected:
    experts_per_rank = workload.num_experts // ep_size  # the workloads use divisible expert counts
    sent = [0] * ep_size
    received = [0] * ep_size
    histogram: Counter[int] = Counter()
    for step in steps:
        histogram[workload.runtime_tokens(ep_size, step)] += 1
        for rank in range(ep_size):
            for token_experts in workload.experts(rank, step).tolist():
                targets = {expert // experts_per_rank for expert in token_experts}  # one copy per target rank
                sent[rank] += len(targets) * workload.layers
                for target in targets:
                    received[target] += workload.layers
    return Expected(
        forward_steps=len(steps),
        dispatch_calls=len(steps) * workload.layers,
        tokens_sent=sent,
        tokens_received=received,
        runtime_tokens_histogram=dict(histogram),
        max_runtime_tokens=max(histogram, default=0),
    )
