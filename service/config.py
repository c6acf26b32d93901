"""The service's one Settings object (environment variables ``CAPWATCH_<NAME>``; advisor knobs
``CAPWATCH_ADVISOR__<NAME>``). ``capwatch serve`` flags override the environment."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from capwatch.service.advisor.policy import AdvisorPolicy


# Durations beyond a year are typos (and inf would never expire anything); each field names its own bound.
_MAX_SECONDS = 366 * 86_400.0


# The names of this machine's loopback: what the service binds and answers by default.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAPWATCH_", env_nested_delimiter="__", extra="ignore")

    host: str = Field("127.0.0.1", description="Loopback by default: expose it on purpose, behind a token.")
    port: int = Field(8321, ge=0, le=65535)
    db_path: Path = Field(Path("capwatch.db"), description="SQLite database (WAL).")
    token: SecretStr | None = Field(None, description="Bearer token required on write endpoints when set.")
    allowed_hosts: list[str] = Field(
        list(LOOPBACK_HOSTS), max_length=64,
        description=("Host header names the service answers (DNS rebinding defence); add the names it is served "
                     "under, e.g. CAPWATCH_ALLOWED_HOSTS='[\"127.0.0.1\", \"capwatch.internal\"]', or [\"*\"] for any."))
    max_body_bytes: int = Field(4 << 20, ge=1024, le=1 << 30, description="Larger request bodies get 413.")
    body_timeout_s: float = Field(10.0, gt=0, le=3600, description="A request body not received in full by then gets 408.")
    max_concurrent_bodies: int = Field(
        64, ge=1, le=100_000, description="Request bodies received at once; more get 503 at once (slow clients).")
    docs: bool = Field(False, description="Serve Swagger UI at /docs (its script loads from a CDN); /openapi.json "
                                          "is always served.")
    stale_after_s: float = Field(60.0, gt=0, le=_MAX_SECONDS, description="A rank silent this long is stale.")
    missing_after_s: float = Field(300.0, gt=0, le=_MAX_SECONDS, description="A rank silent this long is missing.")
    window_s: float = Field(60.0, gt=0, le=86_400, description="Group sample window: one peak per window.")
    fold_after_s: float = Field(6 * 3600.0, gt=0, le=_MAX_SECONDS,
                                description="Windows older than this fold into the histogram.")
    retention_s: float = Field(2 * 86_400.0, gt=0, le=_MAX_SECONDS, description="Raw reports older than this are deleted.")
    maintenance_interval_s: float = Field(30.0, gt=0, le=86_400)
    max_batch_reports: int = Field(1024, ge=1, le=100_000, description="Most reports committed in one transaction.")
    prometheus_url: str | None = Field(None, description="Read ranks from this Prometheus instead of reports.")
    prometheus_timeout_s: float = Field(10.0, gt=0, le=3600)
    prometheus_cache_s: float = Field(
        15.0, ge=0, le=86_400, description="Reuse a group's sample history read from Prometheus this long (at most one "
                                "window), so repeated scrapes and requests don't repeat its range queries.")
    advisor: AdvisorPolicy = AdvisorPolicy()

    @field_validator("token")
    @classmethod
    def _token_is_a_secret(cls, token: SecretStr | None) -> SecretStr | None:
        # An empty token would make "Authorization: Bearer " pass: refuse it rather than run open.
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("the token is empty, which would let anyone post reports; set a secret, or unset it "
                             "to run without one")
        return token

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url_is_http(cls, url: str | None) -> str | None:
        # Checked here so a typo fails at start-up, not as a 503 on every request later.
        if url is None:
            return None
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL with a host, like http://127.0.0.1:9090")
        return url
