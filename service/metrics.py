"""The service's own Prometheus metrics, in a registry passed in (never the global one).

Ingest counters and latency are updated by the routes; the per-cluster gauges (current and
recommended caps, bounds, bytes, action, findings, rank states) are computed at scrape time by a
renderer over the groups' digests (see ``ClusterExposition``), so they always match what the API answers. Every per-cluster gauge carries
``ep_group`` (the cluster's name) and ``dispatcher`` (target | draft: the role of the ranks). Names and labels: the
README's service section and docs/.
"""

from __future__ import annotations

import logging

from capwatch.advisor.vocabulary import ACTIONS
from capwatch.dashboards import service_metrics as names
from capwatch.service.digests import GroupDigest, GroupDigests
from capwatch.service.findings import FINDING_KINDS
from capwatch.service.vocabulary import DROP_REASONS, RANK_STATUSES
from capwatch.telemetry.catalogue import GROUP_LABEL, LEGACY_GROUP_LABEL
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)
REJECT_REASONS = ("invalid", "malformed", "too_large", "unauthorized", "unavailable", "unsupported_media_type",
                  "too_slow", "full")


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
        # Counted by capwatch serve's HTTP protocol (service/http_server.py), which bounds every connection.
        self.connections_dropped = Counter(
            names.CONNECTIONS_DROPPED, "Connections the service closed for exceeding a bound, by reason.", ["reason"],
            registry=registry)
        for reason in DROP_REASONS:
            self.connections_dropped.labels(reason)

    def count_dropped_connection(self, reason: str) -> None:
        self.connections_dropped.labels(reason).inc()


# The per-cluster gauge families: name, help, the label after cluster and dispatcher (if any).
FAMILIES: tuple[tuple[str, str, str | None], ...] = (
    (names.CLUSTER_CAP_TOKENS, "Per-rank cap the ranks run (max over ranks).", None),
    (names.RECOMMENDED_CAP_TOKENS, "Advisor's recommended per-rank cap.", None),
    (names.RECOMMENDED_CAP_LOWER_TOKENS, "Lower bound of the recommended cap.", None),
    (names.RECOMMENDED_CAP_UPPER_TOKENS, "Upper bound of the recommended cap.", None),
    (names.RECOMMENDED_WORKSPACE_BYTES, "A2A workspace bytes per rank at the recommended cap (for a reported-bytes "
     "backend away from its reported cap, an estimate in proportion: /advice's workspace_bytes_exact_recommended).",
     None),
    (names.CLUSTER_WORKSPACE_BYTES, "A2A workspace bytes across the EP group now.", None),
    (names.ADVICE_ACTION, "1 for the advisor's current action, 0 for the others.", "action"),
    (names.CONSISTENCY_FINDINGS, "Ranks named by each active consistency finding (0: the finding is not active).",
     "finding"),
    (names.RANKS, "EP ranks by reporting state.", "state"),
)


def _samples(digest: GroupDigest) -> dict[str, list[tuple[str | None, float]]]:
    """The digest's samples per family: (value of the extra label, value)."""
    view, advice = digest.view, digest.advice
    samples: dict[str, list[tuple[str | None, float]]] = {name: [] for name, _, _ in FAMILIES}
    samples[names.CLUSTER_CAP_TOKENS].append((None, view.cap))
    if view.workspace_bytes_group is not None:
        samples[names.CLUSTER_WORKSPACE_BYTES].append((None, view.workspace_bytes_group))
    if advice is not None and advice.action != "insufficient_data":
        samples[names.RECOMMENDED_CAP_TOKENS].append((None, advice.recommended_cap))
        samples[names.RECOMMENDED_CAP_LOWER_TOKENS].append((None, advice.lower_bound))
        samples[names.RECOMMENDED_CAP_UPPER_TOKENS].append((None, advice.upper_bound))
        samples[names.RECOMMENDED_WORKSPACE_BYTES].append((None, advice.workspace_bytes_per_rank_recommended))
    if advice is not None:  # a group without advice exports no action (its error is in the API)
        samples[names.ADVICE_ACTION] = [(name, 1.0 if advice.action == name else 0.0) for name in ACTIONS]
    active = {finding.kind: len(finding.ranks) or 1 for finding in view.findings}
    samples[names.CONSISTENCY_FINDINGS] = [(kind, float(active.get(kind, 0))) for kind in FINDING_KINDS]
    counts = {"reporting": view.ranks_reporting, "stale": view.ranks_stale, "missing": view.ranks_missing}
    samples[names.RANKS] = [(state, float(counts[state])) for state in RANK_STATUSES]
    return samples


def _labels(digest: GroupDigest, extra: str | None, value: str | None, legacy_group_label: bool = False) -> str:
    """Sorted by name, as prometheus_client writes them."""
    pairs = [(GROUP_LABEL, digest.cluster), ("dispatcher", digest.role)]
    if legacy_group_label:  # for one release, the old name beside it (telemetry/exposition.py)
        pairs.append((LEGACY_GROUP_LABEL, digest.cluster))
    if value is not None:
        pairs.append((extra, value))
    return ",".join(f'{name}="{label}"' for name, label in sorted(pairs))


def _value(value: float) -> str:
    return floatToGoString(float(value))


class ClusterExposition:
    """The per-cluster gauges in Prometheus' text format, rendered per group once per digest.

    prometheus_client's collector path costs tens of microseconds per sample (a family object per
    sample, label validation and escaping each scrape): with thousands of groups that was the whole
    scrape. Group names, roles and the extra labels' values are restricted to characters that need no
    escaping (telemetry.report's Name pattern; fixed vocabularies), so each group's lines are
    rendered once, when its digest changes, and a scrape joins them."""

    def __init__(self, digests: GroupDigests, legacy_group_label: bool = False):
        self.digests = digests
        self.legacy_group_label = legacy_group_label
        self._rendered: dict[tuple[str, str], tuple[GroupDigest, dict[str, bytes]]] = {}
        # The list of digests the page was joined from, and the page: one bytes shared by every scrape (a list of
        # parts per scrape was 45,000 references at 5,000 groups, issue 36 F2b) until the list changes.
        self._joined: tuple[list[GroupDigest], bytes] | None = None

    def _lines(self, digest: GroupDigest) -> dict[str, bytes]:
        key = (digest.cluster, digest.role)
        cached = self._rendered.get(key)
        if cached is not None and cached[0] is digest:
            return cached[1]
        lines = {}
        legacy = self.legacy_group_label
        for (name, _, extra), samples in zip(FAMILIES, _samples(digest).values()):
            lines[name] = "".join(f"{name}{{{_labels(digest, extra, label, legacy)}}} {_value(value)}\n"
                                  for label, value in samples).encode()
        self._rendered[key] = (digest, lines)
        return lines

    def render(self) -> list[bytes]:
        """The per-cluster gauges (each group's lines rendered once per digest, the page joined once per list)."""
        try:
            digests = self.digests.every_group(all_roles=True)
        except Exception:  # a scrape must not fail because the source is briefly unreadable
            log.exception("cannot list clusters for /metrics")
            digests = []
        if self._joined is not None and self._joined[0] is digests:  # the same list: the same page
            return [self._joined[1]]
        listed = digests
        digests = [digest for digest in digests if digest.view is not None]  # a quick summary: once computed
        rendered = [self._lines(digest) for digest in digests]
        if len(self._rendered) > 2 * len(digests) + 16:  # forget groups that were pruned
            live = {(digest.cluster, digest.role) for digest in digests}
            self._rendered = {key: value for key, value in self._rendered.items() if key in live}
        parts = []
        for name, help_text, _ in FAMILIES:
            parts.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode())
            parts.extend(lines[name] for lines in rendered)
        self._joined = (listed, b"".join(parts))
        return [self._joined[1]]


class StoreCollector:
    """The store's own state at scrape time: what it holds against its bounds (``store/capacity.py``), and whether
    its database file is still the one it opened and writable (``store/file_watch.py``)."""

    def __init__(self, store):
        self.store = store

    def collect(self):
        clusters, ranks = self.store.held()
        options = self.store.options
        for name, help_text, value in (
                (names.STORE_CLUSTERS, "Clusters the store holds.", clusters),
                (names.STORE_CLUSTERS_LIMIT, "Most clusters the store holds (CAPWATCH_MAX_CLUSTERS).",
                 options.max_clusters),
                (names.STORE_RANKS, "Ranks the store holds, all clusters together.", ranks),
                (names.STORE_RANKS_LIMIT, "Most ranks the store holds (CAPWATCH_MAX_RANKS).", options.max_ranks),
                (names.STORE_DATABASE_LOST, "1 once the database file was deleted, replaced or made unwritable "
                                            "under the service (reports are refused), else 0.",
                 0 if self.store.lost is None else 1)):
            yield GaugeMetricFamily(name, help_text, value=value)


def build_metrics(registry: CollectorRegistry, digests: GroupDigests, store=None) -> ServiceMetrics:
    metrics = ServiceMetrics(registry)
    metrics.clusters = ClusterExposition(digests, getattr(registry, "legacy_group_label", False))
    if store is not None:
        registry.register(StoreCollector(store))
    return metrics


def exposition(metrics: ServiceMetrics) -> list[bytes]:
    """The whole ``/metrics`` page, as pieces to join: the registry's own metrics, then the per-cluster gauges."""
    return [generate_latest(metrics.registry), *metrics.clusters.render()]
