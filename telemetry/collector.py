"""A prometheus_client custom collector for one rank's dispatcher.

Nothing is updated on the hot path: each scrape takes one ``DispatchCounters.snapshot()`` and
turns it into the series of the catalogue. Names, help and labels come from ``catalogue.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from capwatch.backends import spec_of
from capwatch.telemetry import catalogue
from capwatch.telemetry.catalogue import MetricSpec
from capwatch.telemetry.intervals import IntervalTracker, cumulative_buckets, zero_snapshot
from capwatch.telemetry.peak_window import DEFAULT_PEAK_WINDOW_S, TrailingPeak, local_peak_between
from capwatch.telemetry.report import RankConfig, RankIdentity
from capwatch.telemetry.reporter import ReporterStats
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


def _base_name(spec: MetricSpec) -> str:
    suffix = {"counter": "_total", "info": "_info"}.get(spec.type, "")
    return spec.name.removesuffix(suffix)


def _unit(spec: MetricSpec) -> str:
    # prometheus_client appends a unit the name lacks; pass it only where the name already ends with it.
    return spec.unit if spec.unit and _base_name(spec).endswith("_" + spec.unit) else ""


def _family(spec: MetricSpec, labels: tuple[str, ...] | None = None) -> Metric:
    kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}
    labels = labels if labels is not None else spec.labels
    if spec.type == "info":
        return InfoMetricFamily(_base_name(spec), spec.help, labels=catalogue.RANK_LABELS)
    return kinds[spec.type](_base_name(spec), spec.help, labels=labels, unit=_unit(spec))


class DispatchCollector(Collector):
    """Series for one rank and role. ``tracker`` supplies the last closed interval; pass
    ``interval_s`` when no reporter closes intervals, and the collector closes them on scrape.
    ``peak_window_s`` is the trailing window of the scrape-cadence-proof peak gauges."""

    def __init__(
        self,
        tracker: IntervalTracker,
        identity: RankIdentity,
        config: RankConfig,
        *,
        interval_s: float | None = None,
        reporter_stats: Callable[[], ReporterStats] | None = None,
        backend_counts: Callable[[], Mapping[str, int]] | None = None,
        peak_window_s: float = DEFAULT_PEAK_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._tracker = tracker
        self._clock = clock
        baseline = zero_snapshot(config.cap, identity.ep_size, identity.role, time.time())
        self._window = TrailingPeak(baseline, peak_window_s)
        self._local_window = TrailingPeak(baseline, peak_window_s, between=local_peak_between)
        self._config = config
        self._interval_s = interval_s
        self._reporter_stats = reporter_stats
        self._backend_counts = backend_counts  # the rank's backend's own counts (its series' counters), by field
        self._label_values = [identity.cluster, str(identity.ep_rank), identity.role]
        # Each backend's own series, from its parameters (absent on other backends' ranks: None; a backend whose
        # series are the shared ones says its parameters' defaults there).
        self._backend_params = {
            name: getattr(config, name) if getattr(config, name) is not None or not metrics.on_shared_series
            else spec_of(name).params() for name, metrics in catalogue.BACKEND_METRICS.items()}
        shared = {label: self._backend_params[name]
                  for name, labels in catalogue.SHARED_INFO_LABELS.items() for label in labels}
        self._info = {"ep_size": str(identity.ep_size),
                      **{label: getattr(shared.get(label, config), label) or "none"
                         for label in catalogue.INFO_CONFIG_LABELS},
                      "cap_variable": spec_of(config.a2a_backend).rules.cap_env_var}
        # Each engine's limits (None: not that engine's rank) and its info's labels. An empty label is an absent
        # label in Prometheus: a field that is None (an unknown engine version) reads back as None.
        self._engine_limits = {name: getattr(config, name) for name in catalogue.ENGINE_METRICS}
        self._engine_infos = {
            name: None if limits is None else {
                label: "" if getattr(limits, label) is None else str(getattr(limits, label))
                for label in catalogue.ENGINE_METRICS[name].info_labels}
            for name, limits in self._engine_limits.items()}
        self._buckets = catalogue.RUNTIME_TOKEN_BUCKETS

    def describe(self) -> Iterator[Metric]:
        # Names only, so registering never takes a snapshot.
        for spec in catalogue.METRICS:
            yield _family(spec)

    def collect(self) -> Iterator[Metric]:
        if self._interval_s is not None:
            self._tracker.close_if_due(self._interval_s)
        snapshot = self._tracker.snapshot()
        labels = self._label_values
        config = self._config

        for spec, field in catalogue.RANK_CONFIG_GAUGES:
            yield self._gauge(spec, getattr(config, field))
        info = _family(catalogue.INFO)
        info.add_metric(labels, self._info)
        yield info
        for name, metrics in catalogue.ENGINE_METRICS.items():
            yield from self._own_series(metrics, self._engine_limits[name], self._engine_infos[name])
        for name, metrics in catalogue.BACKEND_METRICS.items():
            params = self._backend_params[name]
            yield from self._own_series(metrics, params, None if params is None else {
                label: str(getattr(params, label)) for label in metrics.info_labels})
            own = self._backend_counts() if self._backend_counts is not None and name == config.a2a_backend else {}
            for spec, field in metrics.counters:  # its own counts, on its ranks alone
                yield self._counter(spec, own.get(field, 0) if name == config.a2a_backend else None)

        yield self._counter(catalogue.DISPATCH_CALLS, snapshot.dispatch_calls)
        yield self._counter(catalogue.FORWARD_STEPS, snapshot.forward_steps)
        yield self._counter(catalogue.TOKENS_SENT, snapshot.tokens_sent)
        yield self._counter(catalogue.TOKENS_RECEIVED, snapshot.tokens_received)
        overflows = _family(catalogue.OVERFLOW_EVENTS)
        for (kind, outcome), count in snapshot.overflow_events.items():
            overflows.add_metric([*labels, kind, outcome], count)
        yield overflows
        yield self._counter(catalogue.CHUNKED_ROUNDS, snapshot.chunked_rounds)

        bucket_counts, runtime_tokens_sum = cumulative_buckets(snapshot, self._buckets)
        histogram = _family(catalogue.RUNTIME_TOKENS)
        buckets = [(floatToGoString(bound), count) for bound, count in zip(self._buckets, bucket_counts, strict=True)]
        histogram.add_metric(labels, [*buckets, ("+Inf", snapshot.forward_steps)], runtime_tokens_sum)
        yield histogram
        yield self._gauge(catalogue.RUNTIME_TOKENS_MAX, snapshot.max_runtime_tokens)

        interval = self._tracker.last_interval
        peak = interval.peak_runtime_tokens if interval is not None else None
        yield self._gauge(catalogue.INTERVAL_PEAK_RUNTIME_TOKENS, peak)
        yield self._gauge(catalogue.INTERVAL_PEAK_UTILIZATION, None if peak is None else peak / config.cap)
        window_peak = self._window.observe(snapshot, self._clock())
        yield self._gauge(catalogue.RUNTIME_TOKENS_WINDOW_MAX, window_peak)
        yield self._gauge(catalogue.RUNTIME_TOKENS_WINDOW_UTILIZATION, window_peak / config.cap)
        yield self._gauge(catalogue.INTERVAL_MAX_LOCAL_TOKENS, interval.max_local_tokens if interval is not None else None)
        yield self._gauge(catalogue.LOCAL_TOKENS_WINDOW_MAX, self._local_window.observe(snapshot, self._clock()))
        yield self._gauge(catalogue.PEAK_WINDOW_SECONDS, self._window.window_s)
        yield self._gauge(catalogue.LOCAL_TOKENS_MAX, snapshot.max_local_tokens or None)

        if self._reporter_stats is not None:
            stats = self._reporter_stats()
            yield self._gauge(catalogue.REPORTS_PENDING, stats.pending)
            yield self._counter(catalogue.REPORTS_DELIVERED, stats.delivered)
            yield self._counter(catalogue.REPORT_SEND_FAILURES, stats.send_failures)
            yield self._counter(catalogue.REPORTS_REJECTED, stats.rejected)
            yield self._counter(catalogue.REPORTS_MERGED, stats.merged)
            yield self._counter(catalogue.REPORT_AUTH_FAILURES, stats.auth_failures)
            yield self._counter(catalogue.REPORTER_ERRORS, stats.errors)

    def _own_series(self, metrics: catalogue.OwnMetrics, values, info: dict[str, str] | None) -> Iterator[Metric]:
        """A backend's or an engine's own series: its info with the labels ``info`` and its gauges read from
        ``values`` (its parameters or limits); the families alone on a rank without them (``values`` None)."""
        if metrics.info is not None:
            family = _family(metrics.info)
            if info is not None:
                family.add_metric(self._label_values, info)
            yield family
        for spec, field in metrics.gauges:
            yield self._gauge(spec, None if values is None else getattr(values, field))

    def _gauge(self, spec: MetricSpec, value: float | None) -> Metric:
        """A series for this rank, or the family alone (HELP and TYPE) while the value is unknown."""
        family = _family(spec)
        if value is not None:
            family.add_metric(self._label_values, value)
        return family

    _counter = _gauge
