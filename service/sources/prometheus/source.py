"""The same views and advice, computed from a Prometheus server that already scrapes every rank
(``capwatch serve --prometheus-url``). Reads the per-rank series of ``telemetry/catalogue.py`` through
Prometheus' HTTP API (``api.py``); stores nothing.

Mapping to the report-fed store:
- a rank = one ``moe_a2a_cap_tokens{ep_group, ep_rank, dispatcher}`` series; its last sample's
  timestamp is "last seen" (a rank whose target is down goes stale in Prometheus and shows as missing);
- its config is rebuilt from its series (``rank_config.py``): the ``RankConfig`` its reports carry, so
  the advisor gives the same advice from either source;
- the group sample per window is the window rule in PromQL (``windows.py``, derived from
  ``advisor/sample.py``), over the trailing-window peak gauge ``moe_a2a_runtime_tokens_window_max``
  (no scrape cadence misses a peak) and the ranks whose ``moe_a2a_forward_steps_total`` grew;
- each rank's own largest local batch per window = ``max_over_time`` of ``moe_a2a_local_tokens_window_max``.
Not exported per rank, so not known here (None): boot ids and boot counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from capwatch.advisor.folding import history_of
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.sample import WINDOW_FIELDS, GroupSample, sample_of
from capwatch.service.config import Settings
from capwatch.service.sources.contract import IntervalPages, IntervalRow, RankState, overflow_key, pages_of
from capwatch.service.sources.prometheus.api import MAX_POINTS, PrometheusAPI
from capwatch.service.sources.prometheus.promql import selector
from capwatch.service.sources.prometheus.rank_config import rank_config_of
from capwatch.service.sources.prometheus.windows import group_window_queries, rank_window_queries
from capwatch.telemetry import catalogue

# What rank_states reads besides the cap, in one instant query.
RANK_STATE_SERIES: tuple[str, ...] = (
    *(spec.name for spec, _ in catalogue.RANK_CONFIG_GAUGES if spec is not catalogue.CAP_TOKENS),
    *(spec.name for metrics in (*catalogue.ENGINE_METRICS.values(), *catalogue.BACKEND_METRICS.values())
      for spec in metrics.metrics),
    catalogue.INFO.name,
    catalogue.RUNTIME_TOKENS_WINDOW_MAX.name,
    catalogue.RUNTIME_TOKENS_MAX.name, catalogue.FORWARD_STEPS.name, catalogue.LOCAL_TOKENS_WINDOW_MAX.name,
    catalogue.LOCAL_TOKENS_MAX.name,
)
RankSeriesKey = tuple[int, str]  # ep_rank, dispatcher


def _own_infos(rank: dict[str, tuple[dict, float]], metrics: dict[str, catalogue.OwnMetrics]) -> dict[str, dict | None]:
    """The labels of each engine's or backend's own info series among a rank's series, by its name (None: absent)."""
    return {name: rank.get(own.info.name, (None, 1.0))[0] for name, own in metrics.items() if own.info is not None}


def _rank_key(labels: dict) -> RankSeriesKey:
    return int(labels["ep_rank"]), labels.get("dispatcher", "target")


class PrometheusSource:
    def __init__(self, url: str, settings: Settings, clock: Callable[[], float] = time.time,
                 history_s: float = 7 * 86_400.0):
        self.settings = settings
        self.clock = clock
        self.history_s = history_s
        self.api = PrometheusAPI(url, settings.prometheus_timeout_s)
        # (cluster, role) -> (expires at, history): four range queries over up to a week, so reused
        # briefly; never longer than a window, the granularity at which the history can change.
        self._histories: dict[tuple[str, str], tuple[float, SampleHistory]] = {}
        self.history_cache_s = min(settings.prometheus_cache_s, settings.window_s)

    @property
    def url(self) -> str:
        return self.api.url

    def _by_rank(self, expression: str) -> dict[RankSeriesKey, tuple[dict, float]]:
        """Instant vector keyed by (ep_rank, dispatcher): (labels, value)."""
        return {_rank_key(series["metric"]): (series["metric"], float(series["value"][1]))
                for series in self.api.query(expression, self.clock())}

    # --- ClusterSource ------------------------------------------------------------------------

    def changes(self) -> None:
        """No versions, no log of changes: Prometheus caches its own queries (``prometheus_cache_s``)."""
        return None

    def clusters(self) -> list[str]:
        now = self.clock()
        data = self.api.get(f"/api/v1/label/{catalogue.GROUP_LABEL}/values", {
            "match[]": catalogue.CAP_TOKENS.name, "start": now - self.settings.missing_after_s, "end": now})
        return sorted(data)

    def rank_states(self, cluster: str) -> list[RankState]:
        ranks = selector(cluster)
        caps = self._by_rank(f"{catalogue.CAP_TOKENS.name}{ranks}")
        if not caps:
            return []
        seen = self._by_rank(f"timestamp({catalogue.CAP_TOKENS.name}{ranks})")
        # Every other per-rank series in one query: (ep_rank, dispatcher) -> name -> (labels, value).
        series: dict[RankSeriesKey, dict[str, tuple[dict, float]]] = {}
        for item in self.api.query(f'{{__name__=~"{"|".join(RANK_STATE_SERIES)}", {ranks[1:]}', self.clock()):
            labels = item["metric"]
            series.setdefault(_rank_key(labels), {})[labels["__name__"]] = (labels, float(item["value"][1]))
        overflows: dict[RankSeriesKey, dict[str, int]] = {}
        for item in self.api.query(f"{catalogue.OVERFLOW_EVENTS.name}{ranks}", self.clock()):
            labels = item["metric"]
            count = int(float(item["value"][1]))
            if count:
                overflows.setdefault(_rank_key(labels), {})[overflow_key(labels["kind"], labels["outcome"])] = count

        states = []
        for key, (labels, cap) in sorted(caps.items()):
            rank = series.get(key, {})
            values = {name: value for name, (_, value) in rank.items() if not math.isnan(value)}
            values[catalogue.CAP_TOKENS.name] = cap
            info = rank.get(catalogue.INFO.name, ({}, 1.0))[0]
            config = rank_config_of(values, info, _own_infos(rank, catalogue.ENGINE_METRICS),
                                    _own_infos(rank, catalogue.BACKEND_METRICS))
            if config is None:
                continue  # no usable cap: nothing to size or price

            def tokens(spec: catalogue.MetricSpec) -> int | None:
                value = values.get(spec.name)
                return None if value is None or not math.isfinite(value) else int(value)

            states.append(RankState(
                cluster=cluster, role=key[1], ep_rank=key[0], ep_size=int(info.get("ep_size", 1)),
                host=labels.get("instance"), received_unix_s=seen.get(key, (None, self.clock()))[1], config=config,
                last_peak_runtime_tokens=tokens(catalogue.RUNTIME_TOKENS_WINDOW_MAX) or 0,
                max_runtime_tokens=tokens(catalogue.RUNTIME_TOKENS_MAX) or 0, overflow_totals=overflows.get(key, {}),
                forward_steps_total=tokens(catalogue.FORWARD_STEPS) or 0,
                last_max_local_tokens=tokens(catalogue.LOCAL_TOKENS_WINDOW_MAX),
                max_local_tokens=tokens(catalogue.LOCAL_TOKENS_MAX)))
        return states

    def _windows(self, expression: str, start: float, end: float) -> list[dict]:
        return self.api.query_range(expression, start, end, self.settings.window_s)

    def _span(self, end_unix_s: float) -> tuple[float, float]:
        """The range query's (start, end) covering ``history_s`` up to ``end_unix_s`` in whole windows, so
        each evaluation time ends a window as the window rule aligns them."""
        window = self.settings.window_s
        end = (end_unix_s // window) * window + window
        return end - min(math.ceil(self.history_s / window), MAX_POINTS) * window, end

    def group_windows(self, cluster: str, role: str, start: float, end: float) -> list[GroupSample]:
        """The group's windows ending at ``start``, ``start + window``, ..., ``end`` (multiples of the window),
        by the window rule: one sample per window in which some rank ran steps, oldest first. A window
        without a cap or a peak series is left out; one without overflow series has none."""
        window = self.settings.window_s
        values: dict[str, dict[float, float]] = {}
        for name, expression in group_window_queries(cluster, role, window).items():
            result = self._windows(expression, start, end)
            values[name] = ({float(at): float(value) for at, value in result[0]["values"]
                             if math.isfinite(float(value))} if result else {})
        known = set.intersection(*(set(values[rule.name]) for rule in WINDOW_FIELDS if rule.combine == "max"))
        return [sample_of(at - window, (round(values[rule.name].get(at, 0)) for rule in WINDOW_FIELDS))
                for at in sorted(known)]

    def sample_history(self, cluster: str, role: str) -> SampleHistory:
        now = self.clock()
        cached = self._histories.get((cluster, role))
        if cached is not None and now < cached[0]:
            return cached[1].copy()
        history = history_of(None, self.group_windows(cluster, role, *self._span(now)), self.settings.advisor,
                             self.settings.window_s)
        if self.history_cache_s > 0:
            self._histories = {key: entry for key, entry in self._histories.items() if now < entry[0]}
            self._histories[(cluster, role)] = (now + self.history_cache_s, history)
        return history.copy()

    def interval_rows(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                      limit: int) -> list[IntervalRow]:
        """One row per rank and window ending in [since, until] (the newest ``limit``): a window is the
        interval Prometheus can tell. A window without the rank's peak, cap or step count is left out."""
        window = self.settings.window_s
        since = max(since_unix_s, until_unix_s - MAX_POINTS * window)
        per_rank: dict[str, dict[tuple[int, float], float]] = {}
        for name, expression in rank_window_queries(cluster, role, window).items():
            values = per_rank[name] = {}
            for series in self.api.query_range(expression, since, until_unix_s, window):
                rank = int(series["metric"]["ep_rank"])
                for at, value in series["values"]:
                    if math.isfinite(float(value)):
                        values[(rank, float(at))] = float(value)
        caps, steps, overflows, local = (per_rank[name] for name in
                                         ("cap", "forward_steps", "overflow_events", "max_local_tokens"))

        def max_local_tokens(key: tuple[int, float]) -> int | None:
            # As a report says: 0 without steps; None where steps ran but no local batch was recorded.
            tokens, ran = local.get(key), round(steps[key])
            return None if tokens is None or (tokens == 0 and ran) else int(tokens)

        rows = [IntervalRow(rank, at, int(peak), int(caps[(rank, at)]), round(steps[(rank, at)]),
                            round(overflows.get((rank, at), 0.0)), max_local_tokens((rank, at)))
                for (rank, at), peak in sorted(per_rank["peak_runtime_tokens"].items(),
                                               key=lambda item: (item[0][1], item[0][0]))
                if (rank, at) in steps and caps.get((rank, at), 0) >= 1]
        return rows[-limit:]

    def interval_pages(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float, limit: int,
                       orders: tuple[str, ...], page_rows: int = 2000) -> IntervalPages:
        # Its rows are read at once, bounded by MAX_POINTS windows per rank.
        return pages_of(self.interval_rows(cluster, role, since_unix_s, until_unix_s, limit), limit, orders, page_rows)

    def close(self) -> None:
        self.api.close()
