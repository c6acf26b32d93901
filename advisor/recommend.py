"""The recommender: one visible chain of small pure stages, composed as VPA composes its estimators.

    group samples -> decaying histogram (+ overflow bumps)            history.py, histogram.py
      gate             enough samples and covered time?              (here)
      Evidence         the stages' one input: group, history, policy, and what is measured from them once
                                                                       evidence.py
      size_for_peaks   largest remembered peak + margin, bounds       peaks.py
      size_for_risk    smallest cap meeting the overflow target       tail.py (peaks over threshold, GPD)
      size_for_trend   grown by the daily peaks' trend                trend.py (Mann-Kendall, Theil-Sen)
      raise_to_floor   never below the engine's start-up floor        floor.py
      align            a multiple of the alignment                    alignment.py (sizing/caps.py's rounding)
      clamp_to_budget  within the workspace memory budget             budget.py
      decide           raise now, or a change worth a restart         hysteresis.py
      -> Advice        the decision, the deployment, the coverage, the forecast and the price
                       (outlook.py, kv.py), every stage's reasons in chain order            advice.py
    what-if            each asked cap's outlook, as the advice prices and forecasts its own     outlook.py

Every stage has one interface (``stage.py``): ``stage(given: Evidence, sized: float) -> Step``, each sizing
stage taking the tokens the one before it sized for. ``recommend`` only composes them.
"""

from __future__ import annotations

from capwatch.advisor.advice import Advice, Coverage, Decision, Deployment, Forecast, Price, WhatIf
from capwatch.advisor.alignment import align
from capwatch.advisor.budget import clamp_to_budget
from capwatch.advisor.evidence import Evidence, GroupConfig
from capwatch.advisor.floor import raise_to_floor
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.hysteresis import decide
from capwatch.advisor.kv import kv_trade
from capwatch.advisor.outlook import Outlook, outlook, rounded
from capwatch.advisor.peaks import size_for_peaks
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.stage import Stage, Step, duration
from capwatch.advisor.tail import size_for_risk
from capwatch.advisor.trend import size_for_trend
from capwatch.engines import ENGINE
from capwatch.sizing.byte_units import format_gib

# The sizing stages in order; each takes the tokens the one before it sized for (the first, 0).
SIZING: tuple[Stage[float], ...] = (size_for_peaks, size_for_risk, size_for_trend, raise_to_floor, align,
                                    clamp_to_budget)


def gate(given: Evidence) -> str | None:
    """Why there is no advice yet (None: there is). An overflow is evidence enough, however short the history."""
    history, policy = given.history, given.policy
    overflowing_now = given.overflow_now if given.group.cap_known else 0.0  # never measured against an assumed cap
    if history.sample_count and (not given.short_history or history.overflow_windows or overflowing_now):
        return None
    return (f"{history.sample_count} group samples covering {duration(history.covered_s)}; advice needs "
            f"at least {policy.min_samples} samples and {duration(policy.min_history_s)} of history")


def recommend(history: SampleHistory, group: GroupConfig, policy: AdvisorPolicy) -> Advice:
    """Raises ValueError where the policy leaves no cap within the backend's rules (``for_backend``), and
    SizingError where the group's floor is above the most its backend takes (``alignment.cap_ceiling``)."""
    given = Evidence(history, group, policy.for_backend(group.backend))
    given.cap_ceiling  # noqa: B018 - a group whose floor no cap meets cannot be advised, with or without history
    deployment, coverage = deployment_of(given), coverage_of(history)
    why_not = gate(given)
    if why_not is not None:
        known_now = history.sample_count and given.group.cap_known  # nothing is priced against an assumed cap
        forecast = Forecast(predicted_overflow_rate_current=given.overflow_now if known_now else None,
                            predicted_overflow_rate_recommended=None)
        return Advice.of(Decision.insufficient_data(), deployment, coverage, forecast, Price.none(), [why_not])

    steps: list[Step[float]] = []
    sized = 0.0
    for stage in SIZING:
        steps.append(stage(given, sized))
        sized = steps[-1].value
    decided = decide(given, sized)
    recommended = outlook(given, decided.value.recommended_cap)
    priced = price(given, decided.value.action, recommended)
    reasons = [reason for step in (*steps, decided, priced) for reason in step.reasons]
    if decided.value.low_confidence:
        reasons.insert(0, low_confidence_reason(given))
    return Advice.of(decided.value, deployment, coverage, forecast_of(given, recommended), priced.value, reasons)


def low_confidence_reason(given: Evidence) -> str:
    """What the advice says first where its evidence is short (VPA's LowConfidence condition)."""
    history, policy = given.history, given.policy
    return (f"low confidence: {duration(history.covered_s)} of covered history, less than the "
            f"{duration(given.low_confidence_below_s)} that ends it ({given.peaks.confidence:.0%} of the "
            f"{duration(policy.full_confidence_history_s)} that gives full confidence); until then no lower is advised "
            "whose predicted overflows miss the target at their band's high end")


def deployment_of(given: Evidence) -> Deployment:
    group = given.group
    pricing, current_bytes = group.pricing, given.current_bytes_per_rank if group.cap_known else None
    return Deployment(
        a2a_backend=given.rules.name, cap_variable=given.rules.cap_env_var,
        current_cap=given.current_cap, ep_size=pricing.ep_size, hidden_size=group.hidden_size,
        num_experts=group.num_experts, top_k=group.top_k, workspace_bytes_per_rank_current=current_bytes,
        workspace_bytes_group_current=None if current_bytes is None else current_bytes * pricing.ep_size,
        workspace_bytes_exact_current=None if current_bytes is None else given.current_basis.exact,
        floor_cap=given.floor_cap, floor_binds=None if given.floor is None else given.floor.binds,
        budget_cap=given.budget_cap, kv_bytes_per_token=group.kv_bytes_per_token,
        max_cap_tokens=given.rules.max_cap_tokens, cap_alignment=given.policy.alignment, cap_known=group.cap_known,
        cap_source=group.cap_source, cap_at_least=group.cap_at_least, mem_fraction_static=group.mem_fraction_static,
        cap_set_by=group.cap_set_by, cap_advice_revision=group.cap_advice_revision,
        cap_origin=cap_origin(group.cap_set_by, group.cap_advice_revision, given.rules.cap_env_var))


def cap_origin(set_by: str | None, revision: int | None, cap_variable: str) -> str | None:
    """Who set the group's cap, in words (None where no rank says)."""
    if set_by is None:
        return None
    if set_by == "mixed":
        return "the ranks disagree on who set the cap (see the cap_source_mismatch finding)"
    return ENGINE.cap_source_text(set_by, revision, cap_variable)


def coverage_of(history: SampleHistory) -> Coverage:
    return Coverage(sample_count=history.sample_count, overflow_windows=history.overflow_windows,
                    history_s=history.history_s, covered_history_s=history.covered_s,
                    max_peak_runtime_tokens=history.max_peak_runtime_tokens)


def forecast_of(given: Evidence, recommended: Outlook) -> Forecast:
    trend, known = given.trend, given.group.cap_known
    return Forecast(
        predicted_overflow_rate_current=given.overflow_now if known else None,
        predicted_overflow_rate_recommended=recommended.overflow_rate,
        predicted_overflow_windows_per_day_current=(
            rounded(given.tail.overflow_windows_per_day(given.current_cap)) if known else None),
        predicted_overflow_windows_per_day_recommended=recommended.overflow_windows_per_day,
        predicted_overflow_windows_per_day_recommended_low=recommended.overflow_windows_per_day_low,
        predicted_overflow_windows_per_day_recommended_high=recommended.overflow_windows_per_day_high,
        tail_fit=given.tail.fit is not None, trend_rate_per_day=None if trend is None else round(trend.rate_per_day, 5),
        trend_significant=trend is not None and trend.significant)


def price(given: Evidence, action: str, recommended: Outlook) -> Step[Price]:
    """The recommended cap's workspace bytes, and what changing to it (``action``) frees or costs (in KV-cache
    tokens)."""
    current, current_bytes = given.current_cap, given.current_bytes_per_rank
    recommended_bytes = recommended.bytes_per_rank
    ep_size, rules = given.group.pricing.ep_size, given.rules
    # The price is exact only where every figure in it is: the recommended cap's bytes, and (for a change) the
    # current cap's; a reported-bytes buffer is exact only at the cap it was reported at.
    bases = (recommended.basis,) if action == "set" else (recommended.basis, given.current_basis)
    basis = next((basis for basis in bases if not basis.exact), bases[0])
    estimate = "" if basis.exact else f", {basis.words}"
    reasons = []
    if action == "set":  # the cap in use is unknown: the recommended cap's own bytes, no change priced
        reasons.append(f"at {recommended.cap} the {rules.memory} takes {format_gib(recommended_bytes)} per rank "
                       f"({format_gib(recommended.bytes_group)} across {ep_size} ranks){estimate}")
    elif action != "hold":
        reasons.append(
            f"{'raising' if action == 'raise' else 'lowering'} {current} -> {recommended.cap} changes the "
            f"{rules.memory} from {format_gib(current_bytes)} to {format_gib(recommended_bytes)} per rank "
            f"({format_gib(recommended.bytes_group_delta)} across {ep_size} ranks){estimate}")
    if action == "raise" and rules.over_cap_fallback is not None and current >= (given.floor_cap or 0):
        more = "" if current_bytes is None else f"{format_gib(recommended_bytes - current_bytes)} more "
        reasons.append(
            f"raise to stop the fallback: above the cap an eager step {rules.over_cap_fallback} (no error, nothing "
            f"logged); {current} -> {recommended.cap} trades {more}{rules.memory} per rank for the faster path, "
            f"memory for speed: no rank is at risk at {current}{estimate}")
    traded = (kv_trade(action, current_bytes, recommended_bytes, given.group.kv_bytes_per_token) if action != "set"
              else kv_trade("hold", recommended_bytes, recommended_bytes, given.group.kv_bytes_per_token))
    if traded:
        reasons.append(traded + estimate)
    reserve = rules.engine_reserve_bytes
    over = None if reserve is None else max(0, recommended_bytes - reserve)
    if over:
        reasons.append(
            f"at {recommended.cap} the {rules.memory} takes {format_gib(recommended_bytes)} per rank{estimate}, "
            f"{format_gib(over)} more than {ENGINE.over_reserve_text(reserve, over, given.group.mem_fraction_static)}")
    known = given.group.cap_known
    return Step(Price(workspace_bytes_per_rank_recommended=recommended_bytes,
                      workspace_bytes_group_recommended=recommended.bytes_group,
                      workspace_bytes_group_delta=recommended.bytes_group_delta if known else None,
                      kv_cache_tokens_per_rank_freed=recommended.kv_cache_tokens_per_rank_freed if known else None,
                      workspace_bytes_exact_recommended=recommended.basis.exact, workspace_bytes_basis=basis.words,
                      workspace_bytes_reported_cap=basis.reported_cap,
                      **dict(ENGINE.RESERVE_PRICE.of(over))),
                tuple(reasons))


def whatif(history: SampleHistory, group: GroupConfig, caps: list[int], policy: AdvisorPolicy) -> list[WhatIf]:
    given = Evidence(history, group, policy.for_backend(group.backend))
    policy, floor_cap, budget = given.policy, given.floor_cap, given.policy.budget_bytes_per_rank
    results = []
    for cap in caps:
        row = outlook(given, cap)
        results.append(WhatIf(
            cap=cap,
            predicted_overflow_rate=row.overflow_rate,
            workspace_bytes_per_rank=row.bytes_per_rank,
            workspace_bytes_group=row.bytes_group,
            workspace_bytes_group_delta=row.bytes_group_delta if group.cap_known else None,
            aligned=cap % policy.alignment == 0,
            below_floor=floor_cap is not None and cap < floor_cap,
            within_budget=None if budget is None else row.bytes_per_rank <= budget,
            predicted_overflow_windows_per_day=row.overflow_windows_per_day,
            predicted_overflow_windows_per_day_low=row.overflow_windows_per_day_low,
            predicted_overflow_windows_per_day_high=row.overflow_windows_per_day_high,
            kv_cache_tokens_per_rank_freed=row.kv_cache_tokens_per_rank_freed if group.cap_known else None,
            workspace_bytes_exact=row.basis.exact,
        ))
    return results
