"""The service's one Settings object (environment variables ``CAPWATCH_<NAME>``; advisor knobs
``CAPWATCH_ADVISOR__<NAME>``). ``capwatch serve`` flags override the environment."""

from __future__ import annotations

from pathlib import Path

from capwatch.advisor.policy import DEFAULT_POLICY, MAX_SETTING_SECONDS, AdvisorPolicy
from capwatch.advisor.sample import DEFAULT_WINDOW_S
from capwatch.telemetry.endpoint import bearer_token_problem, http_url_problem
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

# The names of this machine's loopback: what the service binds and answers by default.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class Settings(BaseSettings):
    """Every bound is stated in the field (``capwatch serve --help`` lists them, from here): a value outside it is
    refused at start in one line, so no setting that passes can break a read or a write later."""

    model_config = SettingsConfigDict(env_prefix="CAPWATCH_", env_nested_delimiter="__", extra="ignore")

    host: str = Field("127.0.0.1", description="Loopback by default: expose it on purpose, behind a token.")
    port: int = Field(8321, ge=0, le=65535, description="Port to listen on.")
    db_path: Path = Field(Path("capwatch.db"), description="SQLite database (WAL).")
    token: SecretStr | None = Field(None, description="Bearer token required on write endpoints when set.")
    reads_need_token: bool = Field(False, description="Reads (/v1/..., /metrics) need the token too; /healthz, the "
                                                      "page's own files and /openapi.json do not.")
    allowed_hosts: list[str] = Field(
        list(LOOPBACK_HOSTS), max_length=64,
        description=("Host header names the service answers (DNS rebinding defence); add the names it is served "
                     "under, e.g. CAPWATCH_ALLOWED_HOSTS='[\"127.0.0.1\", \"capwatch.internal\"]', or [\"*\"] for any."))
    max_body_bytes: int = Field(4 << 20, ge=1024, le=1 << 30, description="Larger request bodies get 413.")
    body_timeout_s: float = Field(10.0, ge=0.1, le=3600,
                                  description="A request body not received in full by then gets 408.")
    body_grace_s: float = Field(0.5, ge=0, le=60, description=(
        "A body (of at most 64 KiB) that follows its headers within this needs no slot: clients that write the two "
        "apart (Python's http.client does) across a busy server or a real network are not refused as slow."))
    max_concurrent_bodies: int = Field(
        64, ge=1, le=100_000, description="Request bodies still arriving at once, past their grace (a body that "
                                          "arrives within it takes none); more get 503.")
    max_bodies_per_client: int | None = Field(
        None, ge=1, le=100_000, description=("Of those, the most that one client address may hold (its fair share; "
                                             "unset: an eighth of them, at least 1)."))
    max_connections: int = Field(2048, ge=16, le=1_000_000,
                                 description="Open connections; one more is answered 503 and closed.")
    header_timeout_s: float = Field(10.0, ge=0.5, le=300, description=(
        "A request's line and headers must arrive within this of the connection opening or the previous answer."))
    send_timeout_s: float = Field(10.0, ge=0.5, le=300, description=(
        "A client that reads nothing of its answer for this long is dropped, and what was buffered for it freed."))
    output_buffer_bytes: int = Field(64 << 10, ge=4 << 10, le=16 << 20, description=(
        "Answer bytes buffered per connection; past it the answer waits for the client to read."))
    docs: bool = Field(False, description="Serve Swagger UI at /docs (its script loads from a CDN); /openapi.json "
                                          "is always served.")
    stale_after_s: float = Field(60.0, ge=1, le=MAX_SETTING_SECONDS, description="A rank silent this long is stale.")
    missing_after_s: float = Field(300.0, ge=1, le=MAX_SETTING_SECONDS,
                                   description="A rank silent this long is missing (at least stale_after_s).")
    window_s: float = Field(DEFAULT_WINDOW_S, ge=1, le=86_400, description="Group sample window: one peak per window.")
    fold_after_s: float = Field(6 * 3600.0, ge=1, le=MAX_SETTING_SECONDS,
                                description="Windows older than this fold into the histogram (at least window_s).")
    retention_s: float = Field(2 * 86_400.0, ge=60, le=MAX_SETTING_SECONDS,
                               description="Raw reports older than this are deleted (at least window_s).")
    maintenance_interval_s: float = Field(30.0, ge=0.1, le=86_400, description="How often folding and retention run.")
    max_batch_reports: int = Field(1024, ge=1, le=100_000, description="Most reports committed in one transaction.")
    max_clusters: int = Field(10_000, ge=1, le=1_000_000, description=(
        "Clusters held at once; a report of one more gets 429 (Retry-After) until one is pruned."))
    max_ranks: int = Field(100_000, ge=1, le=10_000_000, description=(
        "Ranks held at once, all clusters together; a report of one more gets 429 (Retry-After)."))
    prometheus_url: str | None = Field(None, description="Read ranks from this Prometheus instead of reports.")
    prometheus_timeout_s: float = Field(10.0, ge=0.1, le=3600, description="Each Prometheus query's time limit.")
    prometheus_cache_s: float = Field(
        15.0, ge=0, le=86_400, description="Reuse a group's sample history read from Prometheus this long (at most one "
                                "window), so repeated scrapes and requests don't repeat its range queries.")
    advisor: AdvisorPolicy = DEFAULT_POLICY

    @model_validator(mode="after")
    def _settings_agree(self) -> Settings:
        # Each pair is checked here so that no combination that passes can break a view, a fold or a request later.
        if self.reads_need_token and self.token is None:
            raise ValueError("CAPWATCH_READS_NEED_TOKEN needs a token: set CAPWATCH_TOKEN too")
        if self.missing_after_s < self.stale_after_s:
            raise ValueError(f"CAPWATCH_MISSING_AFTER_S {self.missing_after_s:g} is below CAPWATCH_STALE_AFTER_S "
                             f"{self.stale_after_s:g}: a rank is stale before it is missing")
        for name in ("fold_after_s", "retention_s"):
            if getattr(self, name) < self.window_s:
                raise ValueError(f"CAPWATCH_{name.upper()} {getattr(self, name):g} is below CAPWATCH_WINDOW_S "
                                 f"{self.window_s:g}: a window would be dropped before it is complete")
        if self.body_grace_s >= self.body_timeout_s:
            raise ValueError(f"CAPWATCH_BODY_GRACE_S {self.body_grace_s:g} is not below CAPWATCH_BODY_TIMEOUT_S "
                             f"{self.body_timeout_s:g}: a body would time out before its grace ends")
        if self.max_bodies_per_client is None:
            self.max_bodies_per_client = max(1, self.max_concurrent_bodies // 8)
        elif self.max_bodies_per_client > self.max_concurrent_bodies:
            raise ValueError(f"CAPWATCH_MAX_BODIES_PER_CLIENT {self.max_bodies_per_client} is above "
                             f"CAPWATCH_MAX_CONCURRENT_BODIES {self.max_concurrent_bodies}")
        return self

    @field_validator("token")
    @classmethod
    def _token_is_a_secret(cls, token: SecretStr | None) -> SecretStr | None:
        # An empty token would make "Authorization: Bearer " pass: refuse it rather than run open.
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("the token is empty, which would let anyone post reports; set a secret, or unset it "
                             "to run without one")
        problem = None if token is None else bearer_token_problem(token.get_secret_value())
        if problem is not None:  # a token no client can send would refuse every rank
            raise ValueError(f"the token cannot be sent in an Authorization header: {problem}")
        return token

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url_is_http(cls, url: str | None) -> str | None:
        # Checked here so a typo fails at start-up, not as a 503 on every request later.
        problem = None if url is None else http_url_problem(url)
        if problem is not None:
            raise ValueError(f"{url[:200]!r}: {problem}")
        return url


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _bounds(field: FieldInfo) -> str:
    low = high = ""
    for item in field.metadata:
        for name, sign in (("ge", "["), ("gt", "(")):
            if getattr(item, name, None) is not None:
                low = f"{sign}{_number(getattr(item, name))}"
        for name, sign in (("le", "]"), ("lt", ")")):
            if getattr(item, name, None) is not None:
                high = f"{_number(getattr(item, name))}{sign}"
    return f"{low or '(-inf'}, {high or 'inf)'}" if low or high else ""


def settings_reference() -> list[tuple[str, str, str, str]]:
    """Every ``CAPWATCH_*`` variable of the service: (name, default, range, what it does), for ``--help``."""
    rows = []
    for prefix, model in (("CAPWATCH_", Settings), ("CAPWATCH_ADVISOR__", AdvisorPolicy)):
        for name, field in model.model_fields.items():
            if name == "advisor":
                continue
            default = field.get_default(call_default_factory=True)
            shown = "unset" if default is None else (str(default) if not isinstance(default, list) else
                                                     ",".join(default))
            rows.append((prefix + name.upper(), shown, _bounds(field), field.description or ""))
    return rows
