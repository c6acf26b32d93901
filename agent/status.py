"""A plugin's status series (an info metric the engine's plugin names: whether it instruments this process,
and if not, why) and the merged series of a process's roles."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import InfoMetricFamily
from prometheus_client.registry import Collector


class StatusCollector(Collector):
    """``<name>_info{state, reason, <package>_version...}``: the plugin's state in this process."""

    def __init__(self, name: str, help_text: str, state: str, reason: str, versions: dict[str, str | None]):
        self.name, self.help_text = name, help_text
        self.labels = {"state": state, "reason": reason,
                       **{f"{package}_version": version or "none" for package, version in versions.items()}}

    def collect(self) -> Iterator[InfoMetricFamily]:
        family = InfoMetricFamily(self.name, self.help_text)
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
