"""Decode workloads for ``capwatch demo``: per-step, per-rank token counts.

A decode step on one EP rank dispatches one token per running request (times 1 + draft
tokens with speculative decoding), so the workload is a small request-level simulation:
requests arrive at a rate that rises and falls like a day of traffic, with bursts on top;
a router places them on ranks with a skew (one hot rank, as sticky sessions or prefix-cache
affinity make in practice); each request decodes for a geometric number of steps. The
quantity the cap bounds, R, is the largest batch of any rank in a step.

Pure: the same spec and seed give the same counts. No torch, no I/O.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelGeometry:
    """What the dispatch payload looks like. ``priced_hidden_size`` is the real model's, used
    for workspace bytes; ``hidden_size`` is what the CPU demo actually moves."""

    name: str
    hidden_size: int
    num_experts: int
    top_k: int
    priced_hidden_size: int


DEFAULT_MODEL = "deepseek-v3"
CPU_HIDDEN_RANGE = (64, 256)


def scaled_geometry(model: str = DEFAULT_MODEL, ep_size: int = 4) -> ModelGeometry:
    """The sizing module's preset scaled down for CPUs: hidden size /64 clamped to 64..256 (a power
    of two); experts and top-k kept, so the routing fan-out per token is the real model's. Experts
    are only multiplied (keeping top_k / num_experts) when there are fewer than ranks."""
    from capwatch.sizing.checks import SizingError
    from capwatch.sizing.model_presets import known_model_names, model_geometry

    try:
        preset = model_geometry(model)
    except SizingError:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(known_model_names())}") from None
    hidden_size, num_experts, top_k = preset.hidden_size, preset.num_experts, preset.top_k
    low, high = CPU_HIDDEN_RANGE
    cpu_hidden = min(high, max(low, 2 ** round(math.log2(max(1, hidden_size // 64)))))
    if num_experts < ep_size:
        scale = math.ceil(ep_size / num_experts)
        num_experts, top_k = num_experts * scale, top_k * scale
    return ModelGeometry(preset.name, cpu_hidden, num_experts, min(top_k, num_experts), hidden_size)


@dataclass(frozen=True)
class WorkloadSpec:
    ranks: int = 4
    steps: int = 1200
    peak_tokens_per_rank: int = 320  # mean batch per rank at the top of the "day"
    trough_ratio: float = 0.2  # concurrency at the bottom of the day / at the top
    day_steps: int = 800  # steps in one rise-and-fall cycle
    mean_decode_steps: int = 60  # mean output length of a request, in steps
    burst_probability: float = 0.01  # chance a burst starts at a step
    burst_steps: int = 20
    burst_factor: float = 3.0  # arrival rate multiplier during a burst
    hot_rank: int | None = 1  # the rank that gets more than its share (None: balanced)
    hot_rank_share: float = 1.6  # its weight relative to the others
    speculative_tokens: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "ranks": self.ranks >= 1, "steps": self.steps >= 1, "peak_tokens_per_rank": self.peak_tokens_per_rank >= 1,
            "trough_ratio": 0 <= self.trough_ratio <= 1, "day_steps": self.day_steps >= 2,
            "mean_decode_steps": self.mean_decode_steps >= 1, "burst_probability": 0 <= self.burst_probability <= 1,
            "burst_steps": self.burst_steps >= 1, "burst_factor": self.burst_factor >= 1,
            "hot_rank_share": self.hot_rank_share > 0, "speculative_tokens": self.speculative_tokens >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid workload settings: {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}")
        if self.hot_rank is not None and not 0 <= self.hot_rank < self.ranks:
            raise ValueError(f"hot_rank {self.hot_rank} must be in 0..{self.ranks - 1}")


def arrival_rate(spec: WorkloadSpec, step: int) -> float:
    """Requests arriving per step across the group, before bursts: a cosine day that starts
    at the trough, so a run shows the rise, the peak and the fall."""
    full = spec.ranks * spec.peak_tokens_per_rank / (spec.mean_decode_steps * (1 + spec.speculative_tokens))
    phase = 0.5 - 0.5 * math.cos(2 * math.pi * step / spec.day_steps)
    return full * (spec.trough_ratio + (1 - spec.trough_ratio) * phase)


def rank_weights(spec: WorkloadSpec) -> list[float]:
    weights = [1.0] * spec.ranks
    if spec.hot_rank is not None and spec.ranks > 1:
        weights[spec.hot_rank] = spec.hot_rank_share
    total = sum(weights)
    return [weight / total for weight in weights]


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 30:  # normal approximation; exact enough for request counts and much faster
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, product, count = math.exp(-mean), rng.random(), 0
    while product > limit:
        product *= rng.random()
        count += 1
    return count


def _binomial(rng: random.Random, trials: int, probability: float) -> int:
    if trials <= 0 or probability <= 0:
        return 0
    if trials > 40:
        mean = trials * probability
        return min(trials, max(0, round(rng.gauss(mean, math.sqrt(mean * (1 - probability))))))
    return sum(rng.random() < probability for _ in range(trials))


def generate_token_counts(spec: WorkloadSpec) -> list[list[int]]:
    """Per step, the tokens each rank dispatches ([steps][ranks])."""
    rng = random.Random(spec.seed)
    weights = rank_weights(spec)
    finish_probability = 1 / spec.mean_decode_steps
    tokens_per_request = 1 + spec.speculative_tokens
    # Start in steady state at the trough, not from an empty server.
    running = [round(arrival_rate(spec, 0) * spec.mean_decode_steps * weight) for weight in weights]
    burst_left = 0
    counts: list[list[int]] = []
    for step in range(spec.steps):
        if burst_left == 0 and rng.random() < spec.burst_probability:
            burst_left = spec.burst_steps
        rate = arrival_rate(spec, step) * (spec.burst_factor if burst_left else 1.0)
        burst_left = max(0, burst_left - 1)
        for rank, weight in enumerate(weights):
            running[rank] += _poisson(rng, rate * weight) - _binomial(rng, running[rank], finish_probability)
            running[rank] = max(0, running[rank])
        counts.append([requests * tokens_per_request for requests in running])
    return counts


def runtime_max_tokens(counts: list[list[int]]) -> list[int]:
    """R per step: the largest local batch of any rank (what FlashInfer sizes a dispatch by)."""
    return [max(step) for step in counts]


def expert_popularity(num_experts: int, exponent: float = 1.0, seed: int = 0) -> list[float]:
    """Zipf routing: the i-th most popular expert gets weight 1 / i^exponent. Popularity is
    shuffled over expert ids, so hot experts land on a few ranks, as in real MoE traffic."""
    if num_experts < 1 or exponent < 0:
        raise ValueError(f"need num_experts >= 1 and exponent >= 0, got {num_experts}, {exponent}")
    weights = [1 / (position + 1) ** exponent for position in range(num_experts)]
    random.Random(seed).shuffle(weights)
    total = sum(weights)
    return [weight / total for weight in weights]


@dataclass
class Workload:
    """What the ranks replay: token counts per step and, from a trace, optional step times."""

    token_counts: list[list[int]]
    step_times_s: list[float] | None = None
    source: str = "generated"
    notes: dict = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return len(self.token_counts[0])

    @property
    def steps(self) -> int:
        return len(self.token_counts)
