"""The recommender: one visible chain of small pure pieces, like VPA's.

    group samples -> decaying histogram (+ overflow bumps) -> estimate (target, bounds, confidence)
      -> floor -> alignment -> memory budget -> hysteresis -> Advice (priced in bytes, explained)
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from capwatch.service.advisor.alignment import align_down, align_up
from capwatch.service.advisor.budget import WorkspacePricing, largest_cap_within
from capwatch.service.advisor.estimator import estimate
from capwatch.service.advisor.floor import floor_tokens
from capwatch.service.advisor.history import SampleHistory
from capwatch.service.advisor.hysteresis import worth_changing
from capwatch.service.advisor.policy import AdvisorPolicy

ENV_NAME = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


@dataclass(frozen=True)
class GroupConfig:
    """The EP group's configuration as the ranks report it (the cap is the max over ranks)."""

    cap: int
    pricing: WorkspacePricing
    cuda_graph_max_batch_size: int | None = None
    speculative_tokens: int = 0


class Advice(BaseModel):
    action: str  # raise | lower | hold | insufficient_data
    current_cap: int
    recommended_cap: int | None
    target_cap: int | None  # the estimate before hysteresis (what "hold" declined to move to)
    lower_bound: int | None
    upper_bound: int | None
    confidence: float
    predicted_overflow_rate_current: float | None
    predicted_overflow_rate_recommended: float | None
    workspace_bytes_per_rank_current: int
    workspace_bytes_per_rank_recommended: int | None
    workspace_bytes_group_current: int
    workspace_bytes_group_recommended: int | None
    workspace_bytes_group_delta: int | None
    ep_size: int
    floor_cap: int | None
    budget_cap: int | None
    sample_count: int
    overflow_windows: int
    history_s: float  # first to last sample: stretched by gaps and by a rank clock far off
    covered_history_s: float  # what the history gates use: min(history_s, sample_count x window)
    max_peak_runtime_tokens: int
    env: str | None
    reasons: list[str]


class WhatIf(BaseModel):
    cap: int
    predicted_overflow_rate: float | None
    workspace_bytes_per_rank: int
    workspace_bytes_group: int
    workspace_bytes_group_delta: int
    aligned: bool
    below_floor: bool
    within_budget: bool | None


def _pct(rate: float) -> str:
    return f"{rate:.2%}" if rate else "0%"


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


def recommend(history: SampleHistory, group: GroupConfig, policy: AdvisorPolicy) -> Advice:
    pricing = group.pricing
    ep_size = pricing.ep_size
    current = group.cap
    current_bytes = pricing.bytes_per_rank(current)
    floor_cap = floor_tokens(group.cuda_graph_max_batch_size, group.speculative_tokens)
    budget_cap = (largest_cap_within(policy.budget_bytes_per_rank, pricing, policy.alignment, policy.max_cap)
                  if policy.budget_bytes_per_rank is not None else None)
    # Covered time, not the span: gaps and a rank clock far in the past must not pass for history.
    covered_s = history.covered_s
    base = dict(current_cap=current, workspace_bytes_per_rank_current=current_bytes,
                workspace_bytes_group_current=current_bytes * ep_size, ep_size=ep_size, floor_cap=floor_cap,
                budget_cap=budget_cap, sample_count=history.sample_count, overflow_windows=history.overflow_windows,
                history_s=history.history_s, covered_history_s=covered_s,
                max_peak_runtime_tokens=history.max_peak_runtime_tokens)

    overflow_now = history.usage.share_above(current) if not history.usage.is_empty() else 0.0
    short = history.sample_count < policy.min_samples or covered_s < policy.min_history_s
    if history.sample_count == 0 or (short and history.overflow_windows == 0 and overflow_now == 0.0):
        return Advice(
            action="insufficient_data", recommended_cap=None, target_cap=None, lower_bound=None, upper_bound=None,
            confidence=0.0, predicted_overflow_rate_current=overflow_now if history.sample_count else None,
            predicted_overflow_rate_recommended=None, workspace_bytes_per_rank_recommended=None,
            workspace_bytes_group_recommended=None, workspace_bytes_group_delta=None, env=None,
            reasons=[f"{history.sample_count} group samples covering {covered_s / 60:.0f} min; advice needs at "
                     f"least {policy.min_samples} samples and {policy.min_history_s / 60:.0f} min of history"],
            **base)

    reasons: list[str] = []
    found = estimate(history, policy.target_percentile, policy.lower_percentile, policy.safety_margin,
                     policy.full_confidence_history_s)
    reasons.append(
        f"the group's peak R per {history.window_s:.0f} s window reached {history.max_peak_runtime_tokens} tokens "
        f"over {history.sample_count} windows ({covered_s / 3600:.1f} h covered); sizing for "
        f"{'the largest remembered sample' if policy.target_percentile >= 1 else f'the p{policy.target_percentile * 100:g} sample'}"
        f" plus a {policy.safety_margin:.0%} margin gives {found.target_tokens:.0f} tokens")
    if history.overflow_windows:
        reasons.append(f"{history.overflow_windows} windows overflowed the cap; each adds a sample "
                       f"{policy.bump_factor:g}x above what was used")

    target = found.target_tokens
    if floor_cap is not None and target < floor_cap:
        reasons.append(f"raised to the floor {floor_cap}: the largest CUDA-graph decode batch "
                       f"{group.cuda_graph_max_batch_size} x (1 + {group.speculative_tokens} speculative tokens)")
        target = floor_cap
    target = max(target, policy.min_cap)
    target_cap = min(align_up(target, policy.alignment), align_down(policy.max_cap, policy.alignment))
    recommended = target_cap
    if budget_cap is not None and recommended > budget_cap:
        reasons.append(f"clamped to {budget_cap}, the largest cap whose workspace fits the budget of "
                       f"{_gib(policy.budget_bytes_per_rank)} per rank (the estimate wanted {recommended})")
        recommended = budget_cap
        target_cap = budget_cap
    if floor_cap is not None and budget_cap is not None and budget_cap < floor_cap:
        reasons.append(f"the memory budget allows at most {budget_cap} tokens, below the floor {floor_cap}: "
                       "the budget wins, expect overflows at full decode batches")

    lower_bound = align_down(found.lower_tokens, policy.alignment) or policy.alignment
    upper_bound = align_up(found.upper_tokens, policy.alignment)
    if floor_cap is not None:
        lower_bound = max(lower_bound, floor_cap)
    upper_bound = max(upper_bound, recommended)
    lower_bound = min(lower_bound, recommended)

    # A cap that is being exceeded, or that sits below the floor, fails dispatches: raise now,
    # whatever the hysteresis says. Everything else waits for a change worth a restart.
    if (overflow_now > 0.0 or history.overflow_windows > 0 and current < recommended) and recommended > current:
        action = "raise"
        reasons.append(f"{_pct(overflow_now)} of windows peaked above the current cap {current}")
    elif floor_cap is not None and current < floor_cap and recommended > current:
        action = "raise"
        reasons.append(f"the current cap {current} is below the floor {floor_cap}")
    elif short:
        action = "hold" if recommended <= current else "raise"
        reasons.append("history is still short: not lowering yet")
    else:
        change, why = worth_changing(current, recommended, lower_bound, upper_bound, covered_s,
                                     policy.change_min_history_s, policy.change_min_ratio)
        reasons.append(why)
        action = ("raise" if recommended > current else "lower") if change else "hold"
    if action == "hold":
        recommended = current

    recommended_bytes = pricing.bytes_per_rank(recommended)
    overflow_recommended = history.usage.share_above(recommended)
    if action != "hold":
        reasons.append(
            f"{'raising' if action == 'raise' else 'lowering'} {current} -> {recommended} changes the workspace "
            f"from {_gib(current_bytes)} to {_gib(recommended_bytes)} per rank "
            f"({_gib((recommended_bytes - current_bytes) * ep_size)} across {ep_size} ranks)")
    return Advice(
        action=action, recommended_cap=recommended, target_cap=target_cap, lower_bound=lower_bound,
        upper_bound=upper_bound, confidence=round(found.confidence, 4),
        predicted_overflow_rate_current=overflow_now, predicted_overflow_rate_recommended=overflow_recommended,
        workspace_bytes_per_rank_recommended=recommended_bytes,
        workspace_bytes_group_recommended=recommended_bytes * ep_size,
        workspace_bytes_group_delta=(recommended_bytes - current_bytes) * ep_size,
        env=f"{ENV_NAME}={recommended}", reasons=reasons, **base)


def whatif(history: SampleHistory, group: GroupConfig, caps: list[int], policy: AdvisorPolicy) -> list[WhatIf]:
    pricing = group.pricing
    current_bytes = pricing.bytes_per_rank(group.cap)
    floor_cap = floor_tokens(group.cuda_graph_max_batch_size, group.speculative_tokens)
    results = []
    for cap in caps:
        per_rank = pricing.bytes_per_rank(cap)
        results.append(WhatIf(
            cap=cap,
            predicted_overflow_rate=history.usage.share_above(cap) if history.sample_count else None,
            workspace_bytes_per_rank=per_rank,
            workspace_bytes_group=per_rank * pricing.ep_size,
            workspace_bytes_group_delta=(per_rank - current_bytes) * pricing.ep_size,
            aligned=cap % policy.alignment == 0,
            below_floor=floor_cap is not None and cap < floor_cap,
            within_budget=None if policy.budget_bytes_per_rank is None else per_rank <= policy.budget_bytes_per_rank,
        ))
    return results
