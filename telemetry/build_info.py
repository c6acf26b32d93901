"""``capwatch_build_info``: which capwatch made the series beside it, as ``*_build_info`` series say it."""

from __future__ import annotations

import platform
from collections.abc import Iterator

from capwatch.version import capwatch_version
from prometheus_client.core import InfoMetricFamily
from prometheus_client.metrics_core import Metric

BUILD_INFO = "capwatch_build_info"


class BuildInfoCollector:
    """One series, value 1: the installed distribution's version (capwatch/version.py, as ``capwatch --version``)
    and the Python that runs it. Read once: a process does not change its build."""

    def __init__(self) -> None:
        self._labels = {"version": capwatch_version(), "python_version": platform.python_version()}

    def collect(self) -> Iterator[Metric]:
        family = InfoMetricFamily(BUILD_INFO.removesuffix("_info"), "The capwatch build that serves these series "
                                  "(value is always 1).", value=self._labels)
        yield family
