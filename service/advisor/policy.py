"""The advisor's knobs (part of the service's Settings: ``CAPWATCH_ADVISOR__<NAME>``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdvisorPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    half_life_s: float = Field(86_400.0, gt=0, description="Decay half-life of the sample weights.")
    forget_relative_weight: float = Field(
        2.0 ** -7, ge=0, lt=1, description="Folded buckets lighter than this share of a fresh sample are forgotten.")
    target_percentile: float = Field(1.0, gt=0, le=1, description="Percentile of group peaks to size for.")
    lower_percentile: float = Field(0.95, gt=0, le=1)
    safety_margin: float = Field(0.15, ge=0, le=10)
    bump_factor: float = Field(1.2, ge=1, le=10, description="Overflow bump: max(used x factor, used + min).")
    bump_min_tokens: int = Field(16, ge=0)
    min_samples: int = Field(20, ge=1, description="Fewer group samples than this: insufficient_data.")
    min_history_s: float = Field(600.0, ge=0, description="Less history than this: insufficient_data.")
    full_confidence_history_s: float = Field(86_400.0, gt=0)
    change_min_history_s: float = Field(43_200.0, ge=0, description="History needed before acting inside bounds.")
    change_min_ratio: float = Field(0.10, ge=0, description="Smallest relative change acted on inside bounds.")
    alignment: int = Field(128, ge=1, le=1 << 16)
    min_cap: int = Field(128, ge=1)
    max_cap: int = Field(1 << 20, ge=1)
    budget_bytes_per_rank: int | None = Field(None, ge=1, description="A2A workspace memory budget per rank.")
