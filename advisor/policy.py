"""The advisor's knobs (``CAPWATCH_ADVISOR__<NAME>``: read by ``settings.AdvisorSettings`` and by the service's
Settings alike)."""

from __future__ import annotations

import math

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.caps import CAP_ALIGNMENT, MAX_CAP_TOKENS
from pydantic import BaseModel, ConfigDict, Field, model_validator

# Durations beyond a year are typos (and inf would never expire anything); the service's settings use it too.
MAX_SETTING_SECONDS = 366 * 86_400.0


class AdvisorPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    half_life_s: float = Field(86_400.0, ge=1, le=MAX_SETTING_SECONDS,
                               description="Decay half-life of the sample weights.")
    forget_relative_weight: float = Field(
        2.0 ** -7, ge=0, lt=1, description="Folded buckets lighter than this share of a fresh sample are forgotten.")
    target_percentile: float = Field(1.0, gt=0, le=1, description="Percentile of group peaks to size for.")
    lower_percentile: float = Field(0.95, gt=0, le=1,
                                    description="Percentile of group peaks the lower bound is sized for.")
    safety_margin: float = Field(0.15, ge=0, le=10, description="Margin above the sized peak (0.15 = 15 %).")
    bump_factor: float = Field(1.2, ge=1, le=10, description="Overflow bump: max(used x factor, used + min).")
    bump_min_tokens: int = Field(16, ge=0, le=MAX_CAP_TOKENS,
                                 description="The overflow bump's least increase, in tokens.")
    min_samples: int = Field(20, ge=1, le=10**9, description="Fewer group samples than this: insufficient_data.")
    min_history_s: float = Field(600.0, ge=0, le=MAX_SETTING_SECONDS,
                                 description="Less history than this: insufficient_data.")
    full_confidence_history_s: float = Field(86_400.0, ge=1, le=MAX_SETTING_SECONDS,
                                             description="History that gives full confidence.")
    change_min_history_s: float = Field(43_200.0, ge=0, le=MAX_SETTING_SECONDS,
                                        description="History needed before acting inside bounds.")
    change_min_ratio: float = Field(0.10, ge=0, le=10, description="Smallest relative change acted on inside bounds.")
    alignment: int = Field(CAP_ALIGNMENT, ge=1, le=1 << 16, description="Advised caps are multiples of this.")
    min_cap: int = Field(CAP_ALIGNMENT, ge=1, le=MAX_CAP_TOKENS, description="The smallest cap advised.")
    max_cap: int = Field(MAX_CAP_TOKENS, ge=1, le=MAX_CAP_TOKENS, description=(
        "The largest cap advised (each backend's own largest, in its spec under backends/, bounds it too)."))
    budget_bytes_per_rank: int | None = Field(None, ge=1, le=1 << 42,
                                              description="A2A workspace memory budget per rank.")
    # Risk-based sizing (tail.py): the smallest aligned cap whose predicted overflowing windows per day
    # (the band's high end) is at most this. 1/30: at most one overflowing window a month.
    target_overflow_windows_per_day: float = Field(
        1.0 / 30.0, gt=0, le=86_400,
        description="Risk target: expected overflowing windows per day at the recommended cap.")
    risk_min_margin: float = Field(
        0.05, ge=0, le=1, description="The risk-sized cap stays this far above the largest remembered sample: what "
                                      "lies between samples (a log shows one decode step in 40) is unseen.")
    tail_threshold_quantile: float = Field(0.90, gt=0.5, lt=1, description="Peaks above this quantile are the tail.")
    tail_min_exceedances: int = Field(30, ge=5, le=10**6,
                                      description="Fewer windows above the threshold: no tail fit.")
    # Trend (trend.py): size for the daily peak expected this far ahead when growth is significant.
    trend_horizon_s: float = Field(
        172_800.0, ge=0, le=MAX_SETTING_SECONDS,
        description="Size for the trend's peak this far past the latest full day (default 2 days).")
    trend_alpha: float = Field(0.01, gt=0, lt=1, description="Mann-Kendall significance needed to call a trend.")
    trend_min_days: int = Field(5, ge=3, le=366, description="Full days of daily peaks needed before a trend is called.")
    trend_short_min_days: int = Field(
        3, ge=2, le=366, description="Fewer full days than trend_min_days: days of hourly peaks (each hour against the "
                                     "same hour on the other days) needed before a trend is called.")
    trend_min_rate_per_day: float = Field(0.01, ge=0, le=10,
                                          description="Smallest |growth| per day acted on (0.01 = 1 %).")
    trend_min_day_coverage: float = Field(0.5, gt=0, le=1, description="Share of a day's windows for it to count.")

    @model_validator(mode="after")
    def _an_aligned_cap_fits(self) -> AdvisorPolicy:
        # Refused at start: otherwise every group's advice would fail (a cap of 0) or ignore min_cap.
        if self.max_cap < self.alignment:
            raise ValueError(f"max_cap {self.max_cap} is below the alignment {self.alignment}, so no aligned cap "
                             "fits: raise max_cap or lower the alignment")
        if self.min_cap > self.max_cap:
            raise ValueError(f"min_cap {self.min_cap} is above max_cap {self.max_cap}: lower min_cap or raise max_cap")
        return self

    def for_backend(self, rules: BackendCapRules) -> AdvisorPolicy:
        """This policy within a backend's own rules: caps a multiple of the alignment it requires (DeepEP: 128)
        and none above the most it accepts (DeepEP: 1024). The operator's settings stand where they are
        stricter; ValueError when the two leave no cap."""
        alignment = math.lcm(self.alignment, rules.required_alignment)
        max_cap = min(self.max_cap, rules.max_cap_tokens)
        if (alignment, max_cap) == (self.alignment, self.max_cap):
            return self
        if max_cap < alignment:
            raise ValueError(f"no cap is a multiple of {alignment} and at most {max_cap}: the advisor's alignment "
                             f"{self.alignment} and max_cap {self.max_cap} leave none within the {rules.name} rules "
                             f"(multiples of {rules.required_alignment}, at most {rules.max_cap_tokens})")
        return self.model_copy(update={"alignment": alignment, "max_cap": max_cap, "min_cap": min(self.min_cap, max_cap)})


DEFAULT_POLICY = AdvisorPolicy()  # every default above (a policy is frozen: one shared instance)
