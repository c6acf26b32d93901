"""``capwatch_sglang_plugin_info``: whether the plugin instruments this scheduler, and if not, why."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import InfoMetricFamily
from prometheus_client.registry import Collector

PLUGIN_INFO = "capwatch_sglang_plugin"


class PluginStatusCollector(Collector):
    def __init__(self, state: str, reason: str, versions: dict[str, str | None]):
        self.labels = {"state": state, "reason": reason,
                       **{f"{name}_version": version or "none" for name, version in versions.items()}}

    def collect(self) -> Iterator[InfoMetricFamily]:
        family = InfoMetricFamily(PLUGIN_INFO, "Whether capwatch instruments this SGLang scheduler, and why not.")
        family.add_metric([], self.labels)
        yield family


class RolesCollector(Collector):
    """The dispatch series of every role of one process (target, draft, sp_prefill) in one registry:
    families of one name are merged, told apart by their ``dispatcher`` label."""

    def __init__(self):
        self.collectors: list[Collector] = []

    def describe(self):
        return []  # the roles arrive after registration; never snapshot on register

    def collect(self):
        merged = {}
        for collector in list(self.collectors):
            for family in collector.collect():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()
