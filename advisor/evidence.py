"""The stages' one typed input: what is known about an EP group, and what is measured from it, once.

Known: the group's configuration as its ranks report it (``GroupConfig``), its history of window peaks and the
policy. Measured from them, each the first time a stage asks and then kept: the peaks estimate with its bounds
(``peaks.py``), the tail model (``tail.py``: a 48-fit bootstrap), the peaks' trend (``trend.py``), SGLang's
start-up floor (``floor.py``) and the largest cap the memory budget allows (``budget.py``). Nothing is measured
before the gate has let the history through: an empty one has nothing to measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from capwatch.advisor.alignment import cap_ceiling
from capwatch.advisor.budget import largest_cap_within
from capwatch.advisor.floor import Floor, deployment_floor
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.peaks import Estimate, estimate
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.pricing import PriceBasis, Pricing, price_basis
from capwatch.advisor.tail import TailModel, tail_model
from capwatch.advisor.trend import Trend, daily_trend, hourly_trend
from capwatch.backends import DEFAULT_BACKEND
from capwatch.sizing.backends import BackendCapRules
from pydantic import BaseModel


@dataclass(frozen=True)
class GroupConfig:
    """The EP group's configuration as the ranks report it (the cap is the max over ranks)."""

    cap: int
    pricing: Pricing
    cuda_graph_max_batch_size: int | None = None
    speculative_tokens: int = 0
    # The engine's start-up floor inputs (an engine's LIMITS, capwatch.engines: merged_limits over the ranks).
    engine_limits: BaseModel | None = None
    kv_bytes_per_token: int | None = None  # the model's KV cache per token per rank (sizing/model_presets.py)
    backend: BackendCapRules = DEFAULT_BACKEND.rules  # whose cap: its variable, bounds and floor wording
    # Whether prefill batches go through this cap: SGLang's FlashInfer rule counts them; DeepEP dispatches
    # them through its low-latency buffer only in --deepep-mode low_latency (auto sends them to normal mode).
    prefill_dispatched: bool = True
    # Whether ``cap`` is the cap in use (reports, --cap, an overflow assertion) or an assumption (a log that shows
    # neither: SGLang's default); where it is assumed, the advice is the cap to set, never a move from it.
    cap_known: bool = True
    cap_source: str = "reported"  # advice.CapSource
    cap_at_least: int | None = None  # the largest batch that ran without an overflow assertion
    mem_fraction_static: float | None = None  # the server's --mem-fraction-static, where known (a log's args)
    # Who set the cap the ranks run (advice.CapSetBy: capwatch at start, the operator, SGLang's default; "mixed"
    # where they disagree) and the advice revision capwatch applied; None where no rank says (no SGLang plugin).
    cap_set_by: str | None = None
    cap_advice_revision: int | None = None
    # The MoE geometry the cap is priced for (the ranks' reports, or a log's model); None where not known.
    hidden_size: int | None = None
    num_experts: int | None = None
    top_k: int | None = None


@dataclass(frozen=True, eq=False)
class Evidence:
    """What every stage reads. Frozen: a stage cannot change what the next one sees."""

    history: SampleHistory
    group: GroupConfig
    policy: AdvisorPolicy

    # --- known without a history ---------------------------------------------------------------

    @property
    def current_cap(self) -> int:
        return self.group.cap

    @cached_property
    def current_bytes_per_rank(self) -> int:
        return self.group.pricing.bytes_per_rank(self.group.cap)

    @cached_property
    def current_basis(self) -> PriceBasis:
        """Whether the cap in use is priced exactly (a reported-bytes buffer: at the cap it was reported at)."""
        return price_basis(self.group.pricing, self.group.cap)

    @property
    def rules(self) -> BackendCapRules:
        return self.group.backend

    @cached_property
    def floor(self) -> Floor | None:
        group = self.group
        return deployment_floor(group.engine_limits, group.cuda_graph_max_batch_size, group.speculative_tokens,
                                group.backend, group.prefill_dispatched)

    @property
    def floor_cap(self) -> int | None:
        return None if self.floor is None else self.floor.tokens

    @cached_property
    def cap_ceiling(self) -> int:
        """The largest cap the advisor produces for the group (``alignment.py``); SizingError when none fits."""
        return cap_ceiling(self)

    @cached_property
    def budget_cap(self) -> int | None:
        policy = self.policy
        if policy.budget_bytes_per_rank is None:
            return None
        return largest_cap_within(policy.budget_bytes_per_rank, self.group.pricing, policy.alignment,
                                  min(policy.max_cap, self.group.backend.max_cap_tokens))

    # --- read off the history --------------------------------------------------------------------

    @cached_property
    def overflow_now(self) -> float:
        """The share of remembered windows that peaked above the current cap."""
        usage = self.history.usage
        return 0.0 if usage.is_empty() else usage.share_above(self.group.cap)

    @property
    def low_confidence_below_s(self) -> float:
        """Covered history below which confidence is low: what a change inside the bounds waits for, or a full
        history where the policy calls less than that full."""
        return min(self.policy.change_min_history_s, self.policy.full_confidence_history_s)

    @property
    def low_confidence(self) -> bool:
        """VPA's LowConfidence condition: less covered history than ``low_confidence_below_s``."""
        return self.history.covered_s < self.low_confidence_below_s

    @property
    def short_history(self) -> bool:
        """Fewer samples, or less covered time, than the policy asks for before lowering. Covered time, not
        the span: gaps and a rank clock far in the past must not pass for history."""
        history, policy = self.history, self.policy
        return history.sample_count < policy.min_samples or history.covered_s < policy.min_history_s

    # --- measured, once (only past the gate: each needs at least one sample) ----------------------

    @cached_property
    def peaks(self) -> Estimate:
        policy = self.policy
        return estimate(self.history, policy.target_percentile, policy.lower_percentile, policy.safety_margin,
                        policy.full_confidence_history_s)

    @cached_property
    def tail(self) -> TailModel:
        return tail_model(self.history, self.policy)

    @cached_property
    def trend(self) -> Trend | None:
        """The daily peaks' trend; with fewer full days than that needs, the hourly peaks' (a short history)."""
        policy, history = self.policy, self.history
        daily = daily_trend(history.daily_peaks(policy.trend_min_day_coverage), policy.trend_alpha,
                            policy.trend_min_days, policy.trend_min_rate_per_day)
        if daily is not None:
            return daily
        return hourly_trend(history.hourly_peaks(policy.trend_min_day_coverage), policy.trend_alpha,
                            policy.trend_short_min_days, policy.trend_min_rate_per_day)
