"""A rank's config rebuilt from its series: the config gauges of ``catalogue.RANK_CONFIG_GAUGES``,
``SGLANG_LIMIT_GAUGES`` and each backend's (``BACKEND_METRICS``), the labels of ``moe_a2a_info`` (ep_size,
versions, backend), of ``moe_a2a_sglang_info`` and of each backend's own info.

From an exporter of this release that is exactly the ``RankConfig`` its reports carry, validated once,
here. Without the geometry gauges (an exporter older than them), or from series no rank could have
reported together (a hand-written exporter), it is an ``UnpricedConfig``: what prices without a geometry,
each field the series do not give left unknown rather than guessed.
"""

from __future__ import annotations

import dataclasses
import math

from capwatch.backends import SPECS, nest_params
from capwatch.service.sources.contract import UnpricedConfig
from capwatch.telemetry import catalogue
from capwatch.telemetry.report import RankConfig, SGLangLimits
from pydantic import ValidationError

GEOMETRY = ("hidden_size", "top_k", "num_experts")


def _default(model, name: str):
    """A report field's own default: what a series or label the exporter left out stands for."""
    return model.model_fields[name].default


# The gauges of fields a rank may leave unset (or an older exporter lacks) stand for RankConfig's defaults.
_REPORT_DEFAULTS = {name: _default(RankConfig, name) for name in (
    "allocated_workspace_bytes", "cuda_graph_max_batch_size", "speculative_tokens")}
_UNPRICED_FIELDS = {item.name for item in dataclasses.fields(UnpricedConfig)} - set(GEOMETRY)


def rank_config_of(values: dict[str, float], info: dict[str, str], sglang_info: dict[str, str] | None,
                   backend_infos: dict[str, dict[str, str] | None] | None = None) -> RankConfig | UnpricedConfig | None:
    """``values`` by metric name, the labels of ``moe_a2a_info``, of ``moe_a2a_sglang_info`` (None: not under
    SGLang) and of each backend's own info by backend name (None or absent: not that backend's rank). None when
    the series do not say the rank's cap (a positive number). A backend whose series are the shared ones
    (``on_shared_series``) gives its parameters at the config's top level, as its ranks' series always said them:
    RankConfig's own rule (``capwatch.backends.nest_params``) puts them under it, or on another backend's rank
    accepts only their defaults."""
    def number(spec: catalogue.MetricSpec) -> int | None:
        value = values.get(spec.name)
        return None if value is None or not math.isfinite(value) else int(value)

    config: dict = {**_REPORT_DEFAULTS, "backend": info.get("backend", "unknown"),
                    **{name: info.get(name, _default(RankConfig, name)) for name in ("overflow_policy", "a2a_backend")},
                    "sglang": None}
    for spec, name in catalogue.RANK_CONFIG_GAUGES:
        if number(spec) is not None:
            config[name] = number(spec)
    if sglang_info is not None:
        limits = {name: number(spec) for spec, name in catalogue.SGLANG_LIMIT_GAUGES if number(spec) is not None}
        config["sglang"] = {"sglang_version": sglang_info.get("sglang_version") or None,
                            **{name: sglang_info.get(name, _default(SGLangLimits, name))
                               for name in ("disaggregation_mode", "cap_source")},
                            "floor_rule": sglang_info.get("floor_rule") or _default(SGLangLimits, "floor_rule"),
                            "advice_revision": sglang_info.get("advice_revision") or None,
                            **limits}
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
            config["sglang"] = None
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
    try:
        fields["sglang"] = None if config["sglang"] is None else SGLangLimits.model_validate(config["sglang"],
                                                                                             strict=False)
    except ValidationError:
        fields["sglang"] = None
    return UnpricedConfig(**fields)
