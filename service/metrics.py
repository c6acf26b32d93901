"""The service's own Prometheus metrics, in a registry passed in (never the global one).

Ingest counters and latency are updated by the routes; the per-cluster gauges (current and
recommended caps, bounds, bytes, action, findings, rank states) are computed at scrape time by a
custom collector, so they always match what the API answers. Every per-cluster gauge carries
``cluster`` and ``dispatcher`` (target | draft: the role of the ranks). Names and labels: the
README's service section and docs/.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from capwatch.dashboards import service_metrics as names
from capwatch.service.aggregate import FINDING_KINDS
from capwatch.service.digests import ClusterDigests

log = logging.getLogger(__name__)
ACTIONS = ("raise", "lower", "hold", "insufficient_data")
RANK_STATES = ("reporting", "stale", "missing")
REJECT_REASONS = ("invalid", "malformed", "too_large", "unauthorized", "unavailable", "unsupported_media_type",
                  "too_slow")


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        # Names are spelled once, in capwatch.dashboards.service_metrics (the dashboards and rules read them
        # there); prometheus_client drops the "_total" of a counter's name and adds it back on exposition.
        self.reports_ingested = Counter(
            names.REPORTS_INGESTED, "Rank reports stored (acknowledged after a durable commit).", registry=registry)
        self.reports_duplicate = Counter(
            names.REPORTS_DUPLICATE, "Rank reports acknowledged but ignored: same boot id and sequence seen.",
            registry=registry)
        self.reports_rejected = Counter(
            names.REPORTS_REJECTED, "Rank reports refused, by reason.", ["reason"], registry=registry)
        for reason in REJECT_REASONS:
            self.reports_rejected.labels(reason)
        self.ingest_latency = Histogram(
            names.INGEST_LATENCY_SECONDS, "Time from request to acknowledgement of a rank report.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=registry)


class ClusterCollector(Collector):
    """Per-cluster gauges from the groups' digests (recomputed only for groups that changed)."""

    def __init__(self, digests: ClusterDigests):
        self.digests = digests

    def describe(self) -> Iterator:
        return iter(())  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def family(name: str, help_text: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_text, labels=["cluster", "dispatcher", *extra])

        cap = family(names.CLUSTER_CAP_TOKENS, "Per-rank cap the ranks run (max over ranks).")
        recommended = family(names.RECOMMENDED_CAP_TOKENS, "Advisor's recommended per-rank cap.")
        lower = family(names.RECOMMENDED_CAP_LOWER_TOKENS, "Lower bound of the recommended cap.")
        upper = family(names.RECOMMENDED_CAP_UPPER_TOKENS, "Upper bound of the recommended cap.")
        recommended_bytes = family(names.RECOMMENDED_WORKSPACE_BYTES,
                                   "A2A workspace bytes per rank at the recommended cap.")
        group_bytes = family(names.CLUSTER_WORKSPACE_BYTES, "A2A workspace bytes across the EP group now.")
        action = family(names.ADVICE_ACTION, "1 for the advisor's current action, 0 for the others.", "action")
        findings = family(names.CONSISTENCY_FINDINGS,
                          "Ranks named by each active consistency finding (0: the finding is not active).", "finding")
        ranks = family(names.RANKS, "EP ranks by reporting state.", "state")
        try:
            digests = self.digests.every_group(all_roles=True)
        except Exception:  # a scrape must not fail because the source is briefly unreadable
            log.exception("cannot list clusters for /metrics")
            digests = []
        for digest in digests:
            view, advice = digest.view, digest.advice
            labels = [digest.cluster, digest.role]
            cap.add_metric(labels, view.cap)
            if view.workspace_bytes_group is not None:
                group_bytes.add_metric(labels, view.workspace_bytes_group)
            if advice is not None and advice.action != "insufficient_data":
                recommended.add_metric(labels, advice.recommended_cap)
                lower.add_metric(labels, advice.lower_bound)
                upper.add_metric(labels, advice.upper_bound)
                recommended_bytes.add_metric(labels, advice.workspace_bytes_per_rank_recommended)
            if advice is not None:  # a group without advice exports no action (its error is in the API)
                for name in ACTIONS:
                    action.add_metric([*labels, name], 1.0 if advice.action == name else 0.0)
            active = {finding.kind: len(finding.ranks) or 1 for finding in view.findings}
            for kind in FINDING_KINDS:
                findings.add_metric([*labels, kind], float(active.get(kind, 0)))
            counts = {"reporting": view.ranks_reporting, "stale": view.ranks_stale, "missing": view.ranks_missing}
            for state in RANK_STATES:
                ranks.add_metric([*labels, state], counts[state])
        yield from (cap, recommended, lower, upper, recommended_bytes, group_bytes, action, findings, ranks)


def build_metrics(registry: CollectorRegistry, digests: ClusterDigests) -> ServiceMetrics:
    metrics = ServiceMetrics(registry)
    registry.register(ClusterCollector(digests))
    return metrics
