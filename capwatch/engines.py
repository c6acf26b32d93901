"""The inference engines capwatch meets, one home package each (``sglang_engine/``), registered here once.

An engine module provides ``NAME`` (its limits ride on the wire as ``RankConfig.<NAME>``), ``TITLE`` (its name in
messages), ``LIMITS`` (the pydantic model of those limits, whose ``engine`` field is ``NAME``), ``merged_limits``,
``floor_terms``, ``floor_why``, ``limits_report_fields`` and ``bind_rules`` (a backend's cap rules with the
engine's variable, default and reserve: ``capwatch.backends`` registers each spec so bound). The report schema, the advisor and the service loop
over ``ENGINES`` or take ``ENGINE`` instead of naming an engine."""

from __future__ import annotations

from capwatch.sglang_engine import engine as sglang_engine

ENGINES = {module.NAME: module for module in (sglang_engine,)}
ENGINE = next(iter(ENGINES.values()))  # the engine of a rank that reports no limits (capwatch advises for it)


def limits_of(config):
    """(engine, its limits) of a rank's config, or None where the config carries no engine's limits."""
    for engine in ENGINES.values():
        limits = getattr(config, engine.NAME, None)
        if limits is not None:
            return engine, limits
    return None
