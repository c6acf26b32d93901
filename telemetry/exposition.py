"""The registry capwatch exposes, on every rank's exporter and the service: Prometheus conventions applied once.

- No ``*_created`` series: prometheus_client adds one beside every counter and histogram it owns; Prometheus
  stores them as series of their own (one per counter, each a timestamp), and nothing capwatch ships reads them.
- ``capwatch_build_info{version}``: which capwatch made these series (``telemetry/build_info.py``).
- ``legacy_group_label``: for one release, every series labelled ``ep_group`` also carries it as ``cluster``, its
  old name, so dashboards and queries can move at their pace (``CAPWATCH_LEGACY_CLUSTER_LABEL=1``; docs/telemetry.md,
  *Migrating from the cluster label*). Off by default: ``cluster`` is the label multi-cluster Prometheus, Thanos
  and kube-prometheus set for the Kubernetes cluster, and the two collide.
"""

from __future__ import annotations

from collections.abc import Iterator

from capwatch.telemetry.build_info import BuildInfoCollector
from capwatch.telemetry.catalogue import GROUP_LABEL, LEGACY_GROUP_LABEL
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric


class ExpositionRegistry(CollectorRegistry):
    """A ``CollectorRegistry`` that serves capwatch's build info and never a ``*_created`` series."""

    def __init__(self, *, legacy_group_label: bool = False, auto_describe: bool = True):
        super().__init__(auto_describe=auto_describe)
        self.legacy_group_label = legacy_group_label
        self.register(BuildInfoCollector())

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            samples = [sample for sample in metric.samples if not sample.name.endswith("_created")]
            if self.legacy_group_label:
                samples = [sample._replace(labels={**sample.labels, LEGACY_GROUP_LABEL: sample.labels[GROUP_LABEL]})
                           if GROUP_LABEL in sample.labels else sample for sample in samples]
            metric.samples = samples
            yield metric
