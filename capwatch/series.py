"""What a backend or an engine exports of its own beside ``moe_a2a_info``, described without the exporter: an info
series and one gauge per number. ``telemetry/catalogue.py`` turns each registered description into metrics, the
collector exports them and the Prometheus source reads them back, by the same rule for backends and engines.

Torch-free and import-free: the engine homes (``sglang_engine/``) sit below ``capwatch.backends`` and state their
series with these types too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GaugeSeries:
    """One number of a backend's parameters (or an engine's limits) as a gauge: ``moe_a2a_<name>_<field>``, or
    ``metric`` where the series had its own name before the registry (kept: dashboards and alerts read it)."""

    field: str
    help: str
    unit: str
    metric: str | None = None


@dataclass(frozen=True)
class CounterSeries:
    """One count a backend's ranks keep of their own (``moe_a2a_<name>_<field>_total``): the engine's hook counts it
    on the host (``RoleWatch.backend_counts``), the collector exports it on that backend's ranks."""

    field: str
    help: str
    unit: str


@dataclass(frozen=True)
class OwnSeries:
    """A backend's or an engine's own series beside ``moe_a2a_info``, read from its parameters or limits: an info
    (``moe_a2a_<name>_info``, its ``info_labels``) and one gauge per number.

    ``info_help`` None (backends only): the labels are ``moe_a2a_info``'s own and the gauges are exported on every
    rank (the wire's first backend, whose parameters were the config's shared fields: their series keep their names
    and say the parameters' defaults on other backends' ranks)."""

    info_help: str | None
    info_labels: tuple[str, ...]
    gauges: tuple[GaugeSeries, ...]
    counters: tuple[CounterSeries, ...] = ()  # its own counts (backends only)

    @property
    def on_shared_series(self) -> bool:
        return self.info_help is None
