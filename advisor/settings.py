"""The advisor's settings from the environment, without the service: ``CAPWATCH_WINDOW_S`` and the policy's
``CAPWATCH_ADVISOR__<NAME>``, the same variables (and bounds) the service's ``Settings`` reads, so advice from
logs (``capwatch advise --sglang-log``) and from reports is shaped alike. Every other ``CAPWATCH_*`` variable is
the service's and is ignored here."""

from __future__ import annotations

from capwatch.advisor.policy import DEFAULT_POLICY, AdvisorPolicy
from capwatch.advisor.sample import DEFAULT_WINDOW_S
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# The group sample's window, declared once: this model and the service's Settings both use it.
WINDOW_S_FIELD = Field(DEFAULT_WINDOW_S, ge=1, le=86_400, description="Group sample window: one peak per window.")


class AdvisorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAPWATCH_", env_nested_delimiter="__", extra="ignore")

    window_s: float = WINDOW_S_FIELD
    advisor: AdvisorPolicy = DEFAULT_POLICY
