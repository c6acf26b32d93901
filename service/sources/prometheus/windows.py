"""The window rule (``advisor/sample.py: WINDOW_FIELDS``) in PromQL, derived from it field by field.

Each field is read per rank from one series, over the window: a field combined by ``max`` from a gauge
(its largest sample), one combined by ``sum`` from a counter (its growth) — within a rank over time as
across ranks. Only ranks whose forward-step counter grew in the window count (an idle rank's trailing
peak or cap says nothing about the need); across them the field's combination is PromQL's aggregation.
A range query with a step of one window then gives one group sample per window.
"""

from __future__ import annotations

from capwatch.advisor.sample import SUM_LIMIT, WINDOW_FIELDS, Combine
from capwatch.service.sources.prometheus.promql import in_window, selector
from capwatch.telemetry import catalogue

# The series each field of the window rule is read from, and the labels that pick it out.
FIELD_SERIES: dict[str, tuple[catalogue.MetricSpec, dict[str, str]]] = {
    "peak_runtime_tokens": (catalogue.RUNTIME_TOKENS_WINDOW_MAX, {}),  # the trailing-window peak: no scrape misses one
    "cap": (catalogue.CAP_TOKENS, {}),
    "overflow_events": (catalogue.OVERFLOW_EVENTS, {"kind": "runtime_over_cap"}),  # every outcome
}
ACTIVITY = catalogue.FORWARD_STEPS
_SERIES_TYPE: dict[Combine, str] = {"max": "gauge", "sum": "counter"}
_AGGREGATION: dict[Combine, str] = {"max": "max", "sum": "sum"}


def _check_field_series() -> None:
    for rule in WINDOW_FIELDS:
        spec, _ = FIELD_SERIES[rule.name]  # a field without its series: add it above
        if spec.type != _SERIES_TYPE[rule.combine]:
            raise TypeError(f"{rule.name} combines by {rule.combine}, so it is read from a "
                            f"{_SERIES_TYPE[rule.combine]}; {spec.name} is a {spec.type}")


_check_field_series()


def active_ranks(cluster: str, role: str, window_s: float) -> str:
    """The ranks whose forward-step counter grew in the window."""
    return f"({in_window(ACTIVITY, selector(cluster, role), window_s)} > 0)"


def group_window_queries(cluster: str, role: str, window_s: float) -> dict[str, str]:
    """Per field of the window rule, the PromQL of the group's value for the window ending at each
    evaluation time."""
    matching = f"on ({', '.join(catalogue.RANK_LABELS)})"
    active = active_ranks(cluster, role, window_s)
    queries = {}
    for rule in WINDOW_FIELDS:
        spec, labels = FIELD_SERIES[rule.name]
        per_rank = in_window(spec, selector(cluster, role, **labels), window_s)
        expression = f"{_AGGREGATION[rule.combine]}({per_rank} and {matching} {active})"
        queries[rule.name] = expression if rule.combine == "max" else f"clamp_max({expression}, {SUM_LIMIT})"
    return queries


def rank_window_queries(cluster: str, role: str, window_s: float) -> dict[str, str]:
    """Per rank and window (the history view's rows): the peak, the cap, the forward steps, the
    runtime_over_cap events and the rank's own largest local batch."""
    ranks = selector(cluster, role)
    overflows = in_window(catalogue.OVERFLOW_EVENTS, selector(cluster, role, kind="runtime_over_cap"), window_s)
    return {
        "peak_runtime_tokens": in_window(catalogue.RUNTIME_TOKENS_WINDOW_MAX, ranks, window_s),
        "cap": in_window(catalogue.CAP_TOKENS, ranks, window_s),
        "forward_steps": in_window(ACTIVITY, ranks, window_s),
        "overflow_events": f"sum by (ep_rank) ({overflows})",
        "max_local_tokens": in_window(catalogue.LOCAL_TOKENS_WINDOW_MAX, ranks, window_s),
    }
