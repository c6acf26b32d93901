"""The service's own Prometheus metrics, in a registry passed in (never the global one).

Ingest counters and latency are updated by the routes; the per-cluster gauges (current and
recommended caps, bounds, bytes, action, findings, rank states) are computed at scrape time by a
custom collector, so they always match what the API answers. Every per-cluster gauge carries
``cluster`` and ``dispatcher`` (target | draft: the role of the ranks). Names and labels: the
README's service section and docs/.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from capwatch.service.aggregate import FINDING_KINDS
from capwatch.service.config import Settings
from capwatch.service.views import cluster_advice, cluster_view

log = logging.getLogger(__name__)
ACTIONS = ("raise", "lower", "hold", "insufficient_data")
RANK_STATES = ("reporting", "stale", "missing")
REJECT_REASONS = ("invalid", "malformed", "too_large", "unauthorized", "unavailable")


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.reports_ingested = Counter(
            "capwatch_reports_ingested", "Rank reports stored (acknowledged after a durable commit).",
            registry=registry)
        self.reports_duplicate = Counter(
            "capwatch_reports_duplicate", "Rank reports acknowledged but ignored: same boot id and sequence seen.",
            registry=registry)
        self.reports_rejected = Counter(
            "capwatch_reports_rejected", "Rank reports refused, by reason.", ["reason"], registry=registry)
        for reason in REJECT_REASONS:
            self.reports_rejected.labels(reason)
        self.ingest_latency = Histogram(
            "capwatch_ingest_latency_seconds", "Time from request to acknowledgement of a rank report.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=registry)


class ClusterCollector(Collector):
    def __init__(self, source, settings: Settings, clock: Callable[[], float]):
        self.source = source
        self.settings = settings
        self.clock = clock

    def describe(self) -> Iterator:
        return iter(())  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def family(name: str, help_text: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_text, labels=["cluster", "dispatcher", *extra])

        cap = family("capwatch_cluster_cap_tokens", "Per-rank cap the ranks run (max over ranks).")
        recommended = family("capwatch_recommended_cap_tokens", "Advisor's recommended per-rank cap.")
        lower = family("capwatch_recommended_cap_lower_tokens", "Lower bound of the recommended cap.")
        upper = family("capwatch_recommended_cap_upper_tokens", "Upper bound of the recommended cap.")
        recommended_bytes = family("capwatch_recommended_workspace_bytes",
                                   "A2A workspace bytes per rank at the recommended cap.")
        group_bytes = family("capwatch_cluster_workspace_bytes", "A2A workspace bytes across the EP group now.")
        action = family("capwatch_advice_action", "1 for the advisor's current action, 0 for the others.", "action")
        findings = family("capwatch_consistency_findings",
                          "Ranks named by each active consistency finding (0: the finding is not active).", "finding")
        ranks = family("capwatch_ranks", "EP ranks by reporting state.", "state")
        now = self.clock()
        try:
            clusters = self.source.clusters()
        except Exception:  # a scrape must not fail because the source is briefly unreadable
            log.exception("cannot list clusters for /metrics")
            clusters = []
        for cluster in clusters:
            try:
                states = self.source.rank_states(cluster)  # once per cluster: shared by every role's view and advice
            except Exception:
                log.exception("cannot read the ranks of cluster %s", cluster)
                continue
            for role in sorted({state.role for state in states}):
                try:
                    view = cluster_view(self.source, cluster, role, now, self.settings, states)
                    advice = cluster_advice(self.source, cluster, role, now, self.settings, states)
                except Exception:
                    log.exception("cannot compute metrics for cluster %s, dispatcher %s", cluster, role)
                    continue
                labels = [cluster, role]
                cap.add_metric(labels, view.cap)
                if view.workspace_bytes_group is not None:
                    group_bytes.add_metric(labels, view.workspace_bytes_group)
                if advice.action != "insufficient_data":
                    recommended.add_metric(labels, advice.recommended_cap)
                    lower.add_metric(labels, advice.lower_bound)
                    upper.add_metric(labels, advice.upper_bound)
                    recommended_bytes.add_metric(labels, advice.workspace_bytes_per_rank_recommended)
                for name in ACTIONS:
                    action.add_metric([*labels, name], 1.0 if advice.action == name else 0.0)
                active = {finding.kind: len(finding.ranks) or 1 for finding in view.findings}
                for kind in FINDING_KINDS:
                    findings.add_metric([*labels, kind], float(active.get(kind, 0)))
                counts = {"reporting": view.ranks_reporting, "stale": view.ranks_stale, "missing": view.ranks_missing}
                for state in RANK_STATES:
                    ranks.add_metric([*labels, state], counts[state])
        yield from (cap, recommended, lower, upper, recommended_bytes, group_bytes, action, findings, ranks)


def build_metrics(registry: CollectorRegistry, source, settings: Settings,
                  clock: Callable[[], float] = time.time) -> ServiceMetrics:
    metrics = ServiceMetrics(registry)
    registry.register(ClusterCollector(source, settings, clock))
    return metrics
