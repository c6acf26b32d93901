"""The inference engines capwatch meets, one home package each (``sglang_engine/``), registered here once.

An engine module provides ``NAME`` (its limits ride on the wire as ``RankConfig.<NAME>``), ``TITLE`` (its name in
messages), ``LIMITS`` (the pydantic model of those limits, whose ``engine`` field is ``NAME``), ``SERIES`` (its
own series beside ``moe_a2a_info``, read from those limits: a ``capwatch.series.OwnSeries``), ``merged_limits``,
``floor_terms``, ``floor_why``, ``limits_report_fields`` and ``bind_rules`` (a backend's cap rules with the
engine's variable, default and reserve: ``capwatch.backends`` registers each spec so bound). The report schema, the advisor and the service loop
over ``ENGINES`` or take ``ENGINE`` instead of naming an engine. For the advice, the command line and the manifests:
``RESERVE_PRICE`` (the advice's field of the bytes beyond the engine's reserve), ``over_reserve_text``,
``server_example`` (the server of the Kubernetes example) and ``LOG_READER`` (the module that adds the engine's
log reader to ``capwatch advise``)."""

from __future__ import annotations

from capwatch.sglang_engine import engine as sglang_engine

ENGINES = {module.NAME: module for module in (sglang_engine,)}
ENGINE = next(iter(ENGINES.values()))  # the engine of a rank that reports no limits (capwatch advises for it)


def limits_of(config):
    """The engine limits a rank's config carries (one engine's ``LIMITS``), or None."""
    return next((limits for engine in ENGINES.values() if (limits := getattr(config, engine.NAME, None)) is not None),
                None)


def engine_of(limits):
    """The engine whose ``LIMITS`` ``limits`` are."""
    return ENGINES[limits.engine]


def as_limits(item):
    """An engine's limits as given: its model, or a dict of one (``engine`` naming it; without: ``ENGINE``'s)."""
    if isinstance(item, dict):
        return ENGINES.get(item.get("engine"), ENGINE).LIMITS.model_validate(item, strict=False)
    return item


def merged_limits(items):
    """One group's engine limits from its ranks' (``as_limits`` each; None where a rank has none): each term's
    largest value, by the engine's own rule; None when no rank reports any."""
    found = [as_limits(item) for item in items if item]
    return engine_of(found[0]).merged_limits(found) if found else None
