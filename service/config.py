"""The service's one Settings object (environment variables ``CAPWATCH_<NAME>``; advisor knobs
``CAPWATCH_ADVISOR__<NAME>``, read alike by the log reader through ``advisor/settings.py``). ``capwatch serve``
flags override the environment, which overrides a TOML config file (``--config``, ``CAPWATCH_CONFIG``), which
overrides the defaults. Per-cluster advisor policy: ``[clusters.<name>.advisor]`` in the file (``CLUSTERS`` as
JSON in the environment), over the global ``[advisor]``."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from capwatch.advisor.policy import DEFAULT_POLICY, MAX_SETTING_SECONDS, AdvisorPolicy
from capwatch.advisor.settings import WINDOW_S_FIELD
from capwatch.telemetry.endpoint import bearer_token_problem, host_name_problem, http_url_problem
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

# The names of this machine's loopback: what the service binds and answers by default.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


# Advisor knobs a cluster may set for itself: how its advice is sized and how much history it needs. The knobs
# that shape the stored history (its decay, what folding forgets, the bump an overflow adds as it is folded in) are
# the store's, one for every cluster: a cluster's own value would be accepted and never used.
STORE_WIDE_ADVISOR_KNOBS = ("half_life_s", "forget_relative_weight", "bump_factor", "bump_min_tokens")


class ClusterSettings(BaseModel):
    """One cluster's own settings: advisor knobs over the global ``advisor`` (e.g. ``safety_margin``,
    ``target_percentile``, ``target_overflow_windows_per_day``, ``min_history_s``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    advisor: dict[str, Any] = Field(default_factory=dict, description="AdvisorPolicy fields to override.")

    @field_validator("advisor")
    @classmethod
    def _known_knobs(cls, advisor: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(advisor) - set(AdvisorPolicy.model_fields))
        if unknown:
            raise ValueError(f"unknown advisor setting(s) {', '.join(unknown)}; known: "
                             f"{', '.join(name for name in AdvisorPolicy.model_fields)}")
        store_wide = sorted(set(advisor) & set(STORE_WIDE_ADVISOR_KNOBS))
        if store_wide:
            raise ValueError(f"{', '.join(store_wide)} shape the stored history of every cluster: set them in "
                             "[advisor], not per cluster")
        return advisor


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
    legacy_cluster_label: bool = Field(False, description=(
        "For one release: /metrics also labels each group's series with the old name 'cluster' beside 'ep_group', "
        "while dashboards and queries move (docs/telemetry.md, Migrating from the cluster label)."))
    stale_after_s: float = Field(60.0, ge=1, le=MAX_SETTING_SECONDS, description="A rank silent this long is stale.")
    missing_after_s: float = Field(300.0, ge=1, le=MAX_SETTING_SECONDS,
                                   description="A rank silent this long is missing (at least stale_after_s).")
    window_s: float = WINDOW_S_FIELD  # the advisor's (advisor/settings.py): the log reader reads it too
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
    clusters: dict[str, ClusterSettings] = Field(default_factory=dict, max_length=10_000, description=(
        "Per-cluster advisor policy over the global one: [clusters.<name>.advisor] in the config file, or JSON "
        "such as CAPWATCH_CLUSTERS='{\"prod-a\": {\"advisor\": {\"safety_margin\": 0.3}}}'."))

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource):
        """Flags (init), then the environment, then the config file (a subclass's ``toml_file``)."""
        sources = [init_settings, env_settings]
        if settings_cls.model_config.get("toml_file"):
            sources.append(TomlConfigSettingsSource(settings_cls))
        return (*sources, dotenv_settings, file_secret_settings)

    def advisor_for(self, cluster: str) -> AdvisorPolicy:
        """The advisor policy of one cluster: its own knobs over the global ones."""
        return self._cluster_policies.get(cluster, self.advisor)

    @cached_property
    def _cluster_policies(self) -> dict[str, AdvisorPolicy]:
        return {name: AdvisorPolicy(**{**self.advisor.model_dump(), **cluster.advisor})
                for name, cluster in self.clusters.items()}

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
        for name, cluster in self.clusters.items():  # each cluster's policy is whole and valid at start
            try:
                AdvisorPolicy(**{**self.advisor.model_dump(), **cluster.advisor})
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"clusters.{name}.advisor: {where}: {first['msg'].removeprefix('Value error, ')}") \
                    from None
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

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts_name_hosts(cls, hosts: list[str]) -> list[str]:
        # An empty list answers 421 to everything, /healthz too: a liveness probe would restart the service.
        if not hosts:
            raise ValueError('an empty list refuses every request (421), /healthz too; name the hosts the service '
                             'is served under, e.g. ["127.0.0.1", "localhost"], or ["*"] for any')
        for host in hosts:
            problem = None if host == "*" else host_name_problem(host.strip().strip("[]"))
            if problem is not None:
                raise ValueError(f"{host[:100]!r}: {problem}")
        return hosts

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


def load_settings(config_file: Path | None = None, **flags) -> Settings:
    """Settings from the flags, the environment and, when given, a TOML file (its keys are the fields' names:
    ``port = 8321``, ``[advisor]``, ``[clusters.prod-a.advisor]``)."""
    if config_file is None:
        return Settings(**flags)
    if not config_file.is_file():
        raise FileNotFoundError(f"the config file {config_file} does not exist or is not a file")
    import tomllib

    with config_file.open("rb") as file:
        unknown = sorted(set(tomllib.load(file)) - set(Settings.model_fields))
    if unknown:  # the environment ignores what it does not know; a file's typo must not pass for a setting
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} (the names are the CAPWATCH_* variables' without "
                         "the prefix, lower case: capwatch serve --help lists them)")

    class FileSettings(Settings):
        model_config = SettingsConfigDict(**{**Settings.model_config, "toml_file": config_file})

    return FileSettings(**flags)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(key: str) -> str:
    return key if key.replace("_", "a").replace("-", "a").isalnum() else _toml_value(key)


def settings_toml(settings: Settings) -> str:
    """The effective settings as a config file (``capwatch serve --print-config``): every field, the token shown as
    set or not, never its value; unset fields are comments (TOML has no null)."""
    data = settings.model_dump(mode="json")
    token_set = data.pop("token", None) is not None
    lines = ["# capwatch serve: the effective settings (flags > environment > config file > defaults)",
             # Never a value a read-back would take for the token: a printed placeholder would become a guessable one.
             "# token is set (not shown: give it with CAPWATCH_TOKEN)" if token_set else "# token is unset"]
    tables = {}
    for key, value in data.items():
        if isinstance(value, dict):
            tables[key] = value
        elif value is None:
            lines.append(f"# {key} is unset")
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        if key == "clusters":
            for cluster, cluster_settings in value.items():
                lines.append(f"\n[clusters.{_toml_key(cluster)}.advisor]")
                lines += [f"{_toml_key(name)} = {_toml_value(item)}" for name, item in cluster_settings["advisor"].items()]
            continue
        lines.append(f"\n[{key}]")
        for name, item in value.items():
            lines.append(f"# {name} is unset" if item is None else f"{_toml_key(name)} = {_toml_value(item)}")
    return "\n".join(lines) + "\n"
