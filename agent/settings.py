"""A rank agent's configuration: ``CAPWATCH_*`` environment variables, read once per process.

An engine's plugin adds its own switches by subclassing ``AgentSettings`` and naming them to ``load``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from capwatch.agent.switch import switch
from capwatch.telemetry.endpoint import bearer_token_problem, http_url_problem
from capwatch.telemetry.exporter import ExporterOptions
from capwatch.telemetry.ports import DEFAULT_BASE_PORT
from capwatch.telemetry.report import RankIdentity
from capwatch.telemetry.reporter import ReporterOptions

PREFIX = "CAPWATCH_"


class SettingsError(ValueError):
    """A CAPWATCH_* variable that cannot be used; the message names it and says what it takes."""


@dataclass(frozen=True)
class AgentSettings:
    service_url: str | None = None  # CAPWATCH_SERVICE_URL; unset: export /metrics only, no reports
    cluster: str = "default"  # CAPWATCH_CLUSTER
    token: str | None = None  # CAPWATCH_TOKEN: the service's bearer token
    metrics_base_port: int = DEFAULT_BASE_PORT  # CAPWATCH_METRICS_BASE_PORT: each scheduler serves base + local GPU index
    metrics_host: str = "127.0.0.1"  # CAPWATCH_METRICS_HOST
    report_interval_s: float = 5.0  # CAPWATCH_REPORT_INTERVAL_S
    final_report_timeout_s: float = 2.0  # CAPWATCH_FINAL_REPORT_TIMEOUT_S: the bounded wait before a rank dies
    # CAPWATCH_LEGACY_CLUSTER_LABEL: for one release, the series carry the group's old label 'cluster' beside
    # 'ep_group' while dashboards and queries move (docs/telemetry.md).
    legacy_cluster_label: bool = False

    def exporter(self, local_gpu_index: int) -> ExporterOptions:
        return ExporterOptions(base_port=self.metrics_base_port, local_rank=local_gpu_index, host=self.metrics_host,
                               legacy_group_label=self.legacy_cluster_label)

    def reporter(self) -> ReporterOptions | None:
        if self.service_url is None:
            return None
        return ReporterOptions(self.service_url, interval_s=self.report_interval_s, bearer_token=self.token)


# Each duration's sane range, in seconds: a report every half second at most (the service's windows are at least
# 1 s) and once an hour at least; an overflowing rank waits at most a minute for its final report before it ends.
RANGES_S = {"REPORT_INTERVAL_S": (0.5, 3600.0), "FINAL_REPORT_TIMEOUT_S": (0.1, 60.0)}


def _number(environ: Mapping[str, str], name: str, kind: type, default):
    raw = environ.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{PREFIX}{name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None
    if name in RANGES_S:
        low, high = RANGES_S[name]
        if not low <= value <= high:  # also NaN and inf: inf would wait forever, 1e-300 report a thousand times a second
            raise SettingsError(f"{PREFIX}{name}={raw!r} is outside {low:g}..{high:g} seconds")
    return value


def _switch(environ: Mapping[str, str], name: str) -> bool:
    try:
        return switch(environ, PREFIX + name, default=False)
    except ValueError as error:
        raise SettingsError(str(error)) from None


Settings = TypeVar("Settings", bound=AgentSettings)


def load(environ: Mapping[str, str] = os.environ, settings_class: type[Settings] = AgentSettings,
         switches: Mapping[str, str] | None = None) -> Settings:
    """Settings from the environment, each checked by the part that uses it (one rule, one place).
    ``switches``: an engine's own on/off fields of ``settings_class``, each with its variable (less the prefix)."""
    settings = settings_class(
        service_url=environ.get(PREFIX + "SERVICE_URL") or None,
        cluster=environ.get(PREFIX + "CLUSTER") or AgentSettings.cluster,
        token=environ.get(PREFIX + "TOKEN") or None,
        metrics_base_port=_number(environ, "METRICS_BASE_PORT", int, AgentSettings.metrics_base_port),
        metrics_host=environ.get(PREFIX + "METRICS_HOST") or AgentSettings.metrics_host,
        report_interval_s=_number(environ, "REPORT_INTERVAL_S", float, AgentSettings.report_interval_s),
        final_report_timeout_s=_number(environ, "FINAL_REPORT_TIMEOUT_S", float,
                                       AgentSettings.final_report_timeout_s),
        **{field: _switch(environ, name) for field, name in (switches or {}).items()},
        legacy_cluster_label=_switch(environ, "LEGACY_CLUSTER_LABEL"),
    )
    endpoint = (("SERVICE_URL", settings.service_url, http_url_problem), ("TOKEN", settings.token, bearer_token_problem))
    for name, value, problem_of in endpoint:
        problem = None if value is None else problem_of(value)
        if problem is not None:  # the token's value is a secret: never echoed
            shown = "" if name == "TOKEN" else f"={value[:200]!r}"
            raise SettingsError(f"{PREFIX}{name}{shown}: {problem}")
    checks = (
        ("CLUSTER", lambda: RankIdentity(cluster=settings.cluster, ep_rank=0, ep_size=1, boot_id="check")),
        ("METRICS_BASE_PORT / CAPWATCH_METRICS_HOST", lambda: settings.exporter(0)),
        ("SERVICE_URL / CAPWATCH_REPORT_INTERVAL_S", settings.reporter),
    )
    for names, check in checks:
        try:
            check()
        except ValueError as error:
            errors = getattr(error, "errors", None)  # pydantic: the first field's message, not the banner
            first = errors()[0]["msg"] if callable(errors) else str(error).splitlines()[0]
            raise SettingsError(f"{PREFIX}{names}: {first}") from None
    return settings
