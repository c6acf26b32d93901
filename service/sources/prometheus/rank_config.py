"""A rank's config rebuilt from its series: the config gauges of ``catalogue.RANK_CONFIG_GAUGES``, each engine's
(``ENGINE_METRICS``) and each backend's (``BACKEND_METRICS``), the labels of ``moe_a2a_info`` (ep_size, versions,
backend), of each engine's own info and of each backend's.

From an exporter of this release that is exactly the ``RankConfig`` its reports carry, validated once,
here. Without the geometry gauges (an exporter older than them), or from series no rank could have
reported together (a hand-written exporter), it is an ``UnpricedConfig``: what prices without a geometry,
each field the series do not give left unknown rather than guessed.
"""

from __future__ import annotations

import dataclasses
import math

from capwatch.backends import SPECS, nest_params
from capwatch.engines import ENGINES
from capwatch.service.sources.contract import UnpricedConfig
from capwatch.telemetry import catalogue
from capwatch.telemetry.report import RankConfig
from pydantic import ValidationError

GEOMETRY = ("hidden_size", "top_k", "num_experts")


def _default(model, name: str):
    """A report field's own default: what a series or label the exporter left out stands for."""
    return model.model_fields[name].default


# The gauges of fields a rank may leave unset (or an older exporter lacks) stand for RankConfig's defaults.
_REPORT_DEFAULTS = {name: _default(RankConfig, name) for name in (
    "allocated_workspace_bytes", "cuda_graph_max_batch_size", "speculative_tokens")}
_UNPRICED_FIELDS = {item.name for item in dataclasses.fields(UnpricedConfig)} - set(GEOMETRY)


def rank_config_of(values: dict[str, float], info: dict[str, str],
                   engine_infos: dict[str, dict[str, str] | None] | None,
                   backend_infos: dict[str, dict[str, str] | None] | None = None) -> RankConfig | UnpricedConfig | None:
    """``values`` by metric name, the labels of ``moe_a2a_info``, of each engine's own info by engine name (None or
    absent: not under that engine) and of each backend's own info by backend name (None or absent: not that
    backend's rank). None when the series do not say the rank's cap (a positive number). An engine's label or gauge
    left out (an older exporter), or an empty label (Prometheus' absent one), stands for its limits' default. A
    backend whose series are the shared ones (``on_shared_series``) gives its parameters at the config's top level,
    as its ranks' series always said them: RankConfig's own rule (``capwatch.backends.nest_params``) puts them under
    it, or on another backend's rank accepts only their defaults."""
    def number(spec: catalogue.MetricSpec) -> int | None:
        value = values.get(spec.name)
        return None if value is None or not math.isfinite(value) else int(value)

    config: dict = {**_REPORT_DEFAULTS, "backend": info.get("backend", "unknown"),
                    **{name: info.get(name, _default(RankConfig, name)) for name in ("overflow_policy", "a2a_backend")},
                    **dict.fromkeys(ENGINES)}
    for spec, name in catalogue.RANK_CONFIG_GAUGES:
        if number(spec) is not None:
            config[name] = number(spec)
    for engine, metrics in catalogue.ENGINE_METRICS.items():
        labels = (engine_infos or {}).get(engine)
        if labels is not None:
            config[engine] = {**{label: labels[label] for label in metrics.info_labels if labels.get(label)},
                              **{name: number(spec) for spec, name in metrics.gauges if number(spec) is not None}}
    for backend, metrics in catalogue.BACKEND_METRICS.items():
        if metrics.on_shared_series:  # "none" on moe_a2a_info is None; a label or gauge left out, the default
            config.update({label: None if info[label] in ("", "none") else info[label]
                           for label in metrics.info_labels if label in info})
            config.update({name: number(spec) for spec, name in metrics.gauges if number(spec) is not None})
            continue
        labels = (backend_infos or {}).get(backend)
        if labels is not None:  # a label left out leaves the parameters invalid: the config is then unpriced
            config[backend] = {**{label: labels[label] for label in metrics.info_labels if label in labels},
                               **{name: number(spec) for spec, name in metrics.gauges if number(spec) is not None}}
    if (config.get("cap") or 0) < 1:
        return None
    if all(name in config for name in GEOMETRY):
        try:
            return RankConfig.model_validate(config, strict=False)
        except ValidationError:
            # Series no rank could report together: their limits and backend parameters are not trusted either.
            config.update(dict.fromkeys(ENGINES))
            for backend, metrics in catalogue.BACKEND_METRICS.items():
                if not metrics.on_shared_series:
                    config[backend] = None
    return _unpriced(config)


def _unpriced(config: dict) -> UnpricedConfig:
    try:
        config = nest_params(config)
    except ValueError:  # another backend's parameters on this rank: not trusted
        pass
    fields = {name: value for name, value in config.items() if name in _UNPRICED_FIELDS}
    for name in ("dispatch_bytes_per_token", "combine_bytes_per_token", "workspace_bytes_per_rank",
                 "allocated_workspace_bytes", "cuda_graph_max_batch_size"):
        if (fields.get(name) or 0) < 1:
            fields[name] = None  # absent, or no size a rank could have: not known
    fields["speculative_tokens"] = max(0, fields.get("speculative_tokens") or 0)
    for spec in SPECS.values():  # parameters a rank could report, or none
        if spec.params is not None and fields.get(spec.name) is not None:
            try:
                fields[spec.name] = spec.params.model_validate(fields[spec.name], strict=False)
            except ValidationError:
                fields[spec.name] = None
    for engine in ENGINES.values():  # limits a rank could report, or none
        try:
            fields[engine.NAME] = None if config[engine.NAME] is None else engine.LIMITS.model_validate(
                config[engine.NAME], strict=False)
        except ValidationError:
            fields[engine.NAME] = None
    return UnpricedConfig(**fields)
