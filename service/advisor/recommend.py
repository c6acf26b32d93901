"""The recommender: one visible chain of small pure stages, composed as VPA composes its estimators.

    group samples -> decaying histogram (+ overflow bumps)          history.py, histogram.py
      -> gate             enough samples and covered time?         (here)
      -> size_for_peaks   largest remembered peak + margin, bounds  estimator.py
      -> size_for_risk    smallest cap meeting the overflow target  tail.py (peaks over threshold, GPD)
      -> size_for_trend   grown by the daily peaks' trend           trend.py (Mann-Kendall, Theil-Sen)
      -> raise_to_floor   never below SGLang's start-up floor       floor.py
      -> align            a multiple of the alignment               (here, sizing/caps.py's rounding)
      -> clamp_to_budget  within the workspace memory budget        (here, priced by budget.py)
      -> decide           raise now, or a change worth a restart    hysteresis.py
      -> Advice           priced in bytes and KV-cache tokens (kv.py), every stage's reasons in chain order

Each stage returns its value and its reasons (``Stage``); ``recommend`` only composes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.service.advisor.budget import largest_cap_within
from capwatch.service.advisor.pricing import WorkspacePricing
from capwatch.service.advisor.peaks import size_for_peaks
from capwatch.service.advisor.floor import deployment_floor, raise_to_floor
from capwatch.service.advisor.history import SampleHistory
from capwatch.service.advisor.hysteresis import decide
from capwatch.service.advisor.kv import kv_tokens, kv_trade
from capwatch.service.advisor.policy import AdvisorPolicy
from capwatch.service.advisor.stage import Stage
from capwatch.service.advisor.tail import size_for_risk, tail_model
from capwatch.service.advisor.trend import size_for_trend
from capwatch.service.vocabulary import Action
from capwatch.sizing.backends import FLASHINFER
from capwatch.sizing.byte_units import format_gib
from capwatch.sizing.caps import align_down, align_up
from capwatch.telemetry.report import SGLangLimits
from pydantic import BaseModel


@dataclass(frozen=True)
class GroupConfig:
    """The EP group's configuration as the ranks report it (the cap is the max over ranks)."""

    cap: int
    pricing: WorkspacePricing
    cuda_graph_max_batch_size: int | None = None
    speculative_tokens: int = 0
    sglang: SGLangLimits | None = None  # SGLang's start-up floor inputs (merged_sglang_limits over the ranks)
    kv_bytes_per_token: int | None = None  # the model's KV cache per token per rank (sizing/model_presets.py)


class Advice(BaseModel):
    action: Action
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
    floor_binds: str | None = None  # which term of the floor sets it
    budget_cap: int | None
    sample_count: int
    overflow_windows: int
    history_s: float  # first to last sample: stretched by gaps and by a rank clock far off
    covered_history_s: float  # what the history gates use: min(history_s, sample_count x window)
    max_peak_runtime_tokens: int
    env: str | None
    reasons: list[str]
    # Risk (tail.py): expected overflowing windows per day, with the recommended cap's band.
    predicted_overflow_windows_per_day_current: float | None = None
    predicted_overflow_windows_per_day_recommended: float | None = None
    predicted_overflow_windows_per_day_recommended_low: float | None = None
    predicted_overflow_windows_per_day_recommended_high: float | None = None
    tail_fit: bool = False  # a generalized Pareto tail was fitted (else the empirical histogram predicts)
    trend_rate_per_day: float | None = None  # ln-growth of daily peaks per day (Theil-Sen), when measured
    trend_significant: bool = False
    kv_bytes_per_token: int | None = None
    kv_cache_tokens_per_rank_freed: int | None = None  # > 0: the change frees room for that many KV tokens


class WhatIf(BaseModel):
    cap: int
    predicted_overflow_rate: float | None
    workspace_bytes_per_rank: int
    workspace_bytes_group: int
    workspace_bytes_group_delta: int
    aligned: bool
    below_floor: bool
    within_budget: bool | None
    predicted_overflow_windows_per_day: float | None = None
    predicted_overflow_windows_per_day_low: float | None = None
    predicted_overflow_windows_per_day_high: float | None = None
    kv_cache_tokens_per_rank_freed: int | None = None  # against the current cap (< 0: the cap costs KV room)


class ClusterAdvice(Advice):
    """What ``GET /v1/clusters/{cluster}/advice`` answers (and ``capwatch advise --json`` prints)."""

    cluster: str
    role: str
    generated_unix_s: float


def gate(history: SampleHistory, policy: AdvisorPolicy, overflow_now: float) -> tuple[bool, bool, str]:
    """(advise at all, history still short, why not). An overflow is evidence enough, however short the history."""
    covered_s = history.covered_s
    short = history.sample_count < policy.min_samples or covered_s < policy.min_history_s
    if history.sample_count == 0 or (short and history.overflow_windows == 0 and overflow_now == 0.0):
        return False, short, (f"{history.sample_count} group samples covering {covered_s / 60:.0f} min; advice needs "
                              f"at least {policy.min_samples} samples and {policy.min_history_s / 60:.0f} min of history")
    return True, short, ""


def align(tokens: float, min_cap: int, max_cap: int, alignment: int, floor_cap: int | None = None) -> Stage:
    """A cap is a multiple of the alignment within [min_cap, max_cap], rounded up (never down). The floor
    outranks max_cap: a cap below it is one the server refuses to start with."""
    ceiling = max(align_down(max_cap, alignment), align_up(floor_cap, alignment) if floor_cap else 0)
    return Stage("alignment", min(align_up(max(tokens, min_cap), alignment), ceiling))


def clamp_to_budget(tokens: int, budget_cap: int | None, floor_cap: int | None, policy: AdvisorPolicy) -> Stage:
    """The memory budget lowers the cap, but never below the floor: below it SGLang refuses to start (and
    a CUDA graph's batch would overflow at capture), so a budget that cannot hold the floor is reported."""
    if budget_cap is None or tokens <= budget_cap:
        return Stage("budget", tokens)
    budget = format_gib(policy.budget_bytes_per_rank)
    if floor_cap is not None and budget_cap < floor_cap:
        return Stage("budget", min(tokens, align_up(floor_cap, policy.alignment)), (
            f"the memory budget of {budget} per rank allows at most {budget_cap} tokens, below the floor "
            f"{floor_cap} that the server needs to start: the floor wins; raise the budget or lower the floor's "
            "inputs (prefill chunk, CUDA-graph batch sizes)",))
    return Stage("budget", budget_cap, (f"clamped to {budget_cap}, the largest cap whose workspace fits the budget "
                                        f"of {budget} per rank (the estimate wanted {tokens})",))


def bounds(lower_tokens: float, upper_tokens: float, recommended: int, floor_cap: int | None,
           alignment: int) -> tuple[int, int]:
    """[lower, upper] the current cap may sit in without a change (aligned; around the recommendation)."""
    lower = align_down(lower_tokens, alignment) or alignment
    upper = align_up(upper_tokens, alignment)
    if floor_cap is not None:
        lower = max(lower, floor_cap)
    return min(lower, recommended), max(upper, recommended)


def recommend(history: SampleHistory, group: GroupConfig, policy: AdvisorPolicy) -> Advice:
    pricing = group.pricing
    ep_size = pricing.ep_size
    current = group.cap
    current_bytes = pricing.bytes_per_rank(current)
    floor = deployment_floor(group.sglang, group.cuda_graph_max_batch_size, group.speculative_tokens)
    floor_cap = None if floor is None else floor.tokens
    budget_cap = (largest_cap_within(policy.budget_bytes_per_rank, pricing, policy.alignment, policy.max_cap)
                  if policy.budget_bytes_per_rank is not None else None)
    # Covered time, not the span: gaps and a rank clock far in the past must not pass for history.
    covered_s = history.covered_s
    base = dict(current_cap=current, workspace_bytes_per_rank_current=current_bytes,
                workspace_bytes_group_current=current_bytes * ep_size, ep_size=ep_size, floor_cap=floor_cap,
                floor_binds=None if floor is None else floor.binds, budget_cap=budget_cap,
                sample_count=history.sample_count, overflow_windows=history.overflow_windows,
                history_s=history.history_s, covered_history_s=covered_s,
                max_peak_runtime_tokens=history.max_peak_runtime_tokens, kv_bytes_per_token=group.kv_bytes_per_token)
    overflow_now = history.usage.share_above(current) if not history.usage.is_empty() else 0.0

    advise, short, why_not = gate(history, policy, overflow_now)
    if not advise:
        return Advice(
            action="insufficient_data", recommended_cap=None, target_cap=None, lower_bound=None, upper_bound=None,
            confidence=0.0, predicted_overflow_rate_current=overflow_now if history.sample_count else None,
            predicted_overflow_rate_recommended=None, workspace_bytes_per_rank_recommended=None,
            workspace_bytes_group_recommended=None, workspace_bytes_group_delta=None, env=None,
            reasons=[why_not], **base)

    # The chain: each stage takes the previous stage's tokens.
    model = tail_model(history, policy)
    peaks, found = size_for_peaks(history, policy)
    risk = size_for_risk(history, model, peaks.tokens, policy)
    trended, trend = size_for_trend(history, risk.tokens, policy)
    floored = raise_to_floor(trended.tokens, floor)
    aligned = align(floored.tokens, policy.min_cap, policy.max_cap, policy.alignment, floor_cap)
    budgeted = clamp_to_budget(int(aligned.tokens), budget_cap, floor_cap, policy)
    target_cap = int(budgeted.tokens)
    lower_bound, upper_bound = bounds(found.lower_tokens, found.upper_tokens, target_cap, floor_cap, policy.alignment)
    action, why = decide(current, target_cap, lower_bound, upper_bound, overflow_now, history.overflow_windows,
                         floor_cap, short, covered_s, policy.change_min_history_s, policy.change_min_ratio)
    stages = (peaks, risk, trended, floored, aligned, budgeted)
    reasons = [reason for stage in stages for reason in stage.reasons] + [why]

    recommended = current if action == "hold" else target_cap
    recommended_bytes = pricing.bytes_per_rank(recommended)
    if action != "hold":
        reasons.append(
            f"{'raising' if action == 'raise' else 'lowering'} {current} -> {recommended} changes the workspace "
            f"from {format_gib(current_bytes)} to {format_gib(recommended_bytes)} per rank "
            f"({format_gib((recommended_bytes - current_bytes) * ep_size)} across {ep_size} ranks)")
    traded = kv_trade(action, current_bytes, recommended_bytes, group.kv_bytes_per_token)
    if traded:
        reasons.append(traded)
    low, high = model.band(recommended)
    return Advice(
        action=action, recommended_cap=recommended, target_cap=target_cap, lower_bound=lower_bound,
        upper_bound=upper_bound, confidence=round(found.confidence, 4),
        predicted_overflow_rate_current=overflow_now,
        predicted_overflow_rate_recommended=history.usage.share_above(recommended),
        workspace_bytes_per_rank_recommended=recommended_bytes,
        workspace_bytes_group_recommended=recommended_bytes * ep_size,
        workspace_bytes_group_delta=(recommended_bytes - current_bytes) * ep_size,
        env=FLASHINFER.env_line(recommended), reasons=reasons,
        predicted_overflow_windows_per_day_current=_rounded(model.overflow_windows_per_day(current)),
        predicted_overflow_windows_per_day_recommended=_rounded(model.overflow_windows_per_day(recommended)),
        predicted_overflow_windows_per_day_recommended_low=_rounded(low),
        predicted_overflow_windows_per_day_recommended_high=_rounded(high),
        tail_fit=model.fit is not None, trend_rate_per_day=None if trend is None else round(trend.rate_per_day, 5),
        trend_significant=trend is not None and trend.significant,
        kv_cache_tokens_per_rank_freed=kv_tokens(current_bytes - recommended_bytes, group.kv_bytes_per_token),
        **base)


def _rounded(value: float) -> float:
    """4 significant digits: a prediction is not more precise, and a folded history then gives the same advice."""
    return float(f"{value:.4g}")


def whatif(history: SampleHistory, group: GroupConfig, caps: list[int], policy: AdvisorPolicy) -> list[WhatIf]:
    pricing = group.pricing
    current_bytes = pricing.bytes_per_rank(group.cap)
    floor = deployment_floor(group.sglang, group.cuda_graph_max_batch_size, group.speculative_tokens)
    floor_cap = None if floor is None else floor.tokens
    model = tail_model(history, policy) if history.sample_count else None
    results = []
    for cap in caps:
        per_rank = pricing.bytes_per_rank(cap)
        band = model.band(cap) if model is not None else (None, None)
        results.append(WhatIf(
            cap=cap,
            predicted_overflow_rate=history.usage.share_above(cap) if history.sample_count else None,
            workspace_bytes_per_rank=per_rank,
            workspace_bytes_group=per_rank * pricing.ep_size,
            workspace_bytes_group_delta=(per_rank - current_bytes) * pricing.ep_size,
            aligned=cap % policy.alignment == 0,
            below_floor=floor_cap is not None and cap < floor_cap,
            within_budget=None if policy.budget_bytes_per_rank is None else per_rank <= policy.budget_bytes_per_rank,
            predicted_overflow_windows_per_day=None if model is None else _rounded(model.overflow_windows_per_day(cap)),
            predicted_overflow_windows_per_day_low=None if band[0] is None else _rounded(band[0]),
            predicted_overflow_windows_per_day_high=None if band[1] is None else _rounded(band[1]),
            kv_cache_tokens_per_rank_freed=kv_tokens(current_bytes - per_rank, group.kv_bytes_per_token),
        ))
    return results
