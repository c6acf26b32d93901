"""The start-up check SGLang lacks: a cap below the decode CUDA-graph batch x tokens per request, for a backend whose
floor SGLang never checks (DeepEP's low-latency cap: ``BackendCapRules.below_floor``). SGLang finds it at the first
big decode step (or the capture of the largest graph) as DeepEP's assertion; the plugin says it at start — one log
line and ``capwatch_sglang_plugin_cap_shortfall_tokens`` — whatever ``CAPWATCH_APPLY`` says, and the service makes
it a finding (``cap_below_decode_graph``) from the rank's reports. The rule is the engine's
(``sglang_engine.floor.unchecked_shortfall``) over the terms the floor module computed (``floors/``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from capwatch.sglang_engine.floor import shortfall_text, unchecked_shortfall
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sizing.backends import BackendCapRules
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger("capwatch.sglang")

CAP_SHORTFALL = "capwatch_sglang_plugin_cap_shortfall_tokens"


class CapShortfallCollector(Collector):
    """``capwatch_sglang_plugin_cap_shortfall_tokens{cap_variable}``: how far the cap this scheduler starts with is
    below the decode CUDA-graph batch x tokens per request (0: not below) — served from the start, before any
    dispatch, so an alert fires before the first big decode step ends the rank."""

    def __init__(self, cap_variable: str, shortfall_tokens: int):
        self.cap_variable = cap_variable
        self.shortfall_tokens = shortfall_tokens

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            CAP_SHORTFALL, "Tokens by which the A2A cap this SGLang scheduler started with is below its decode "
            "CUDA-graph batch x tokens per request, a floor SGLang does not check at start for this backend "
            "(0: not below); above 0, the first full decode batch ends the rank.", labels=["cap_variable"])
        family.add_metric([self.cap_variable], self.shortfall_tokens)
        yield family


def check_cap_at_start(cap: int, limits: SGLangLimits | None, rules: BackendCapRules) -> CapShortfallCollector | None:
    """The check for a scheduler starting with ``cap`` (the backend's variable as its dispatcher will read it): one
    error line where the cap is short; the collector to serve (None: SGLang checks this backend's floor itself, or
    knows no floor terms here)."""
    if rules.below_floor is None or limits is None:
        return None
    shortfall = unchecked_shortfall(cap, limits, rules)
    if shortfall is not None:
        logger.error("capwatch: at start: %s=%d: %s", rules.cap_env_var, cap, shortfall_text(cap, shortfall, rules))
    return CapShortfallCollector(rules.cap_env_var, 0 if shortfall is None else shortfall[0] - cap)
