"""The dashboards tests' promtool fixture, for the rules inside the PrometheusRule."""

from tests.dashboards.conftest import promtool  # noqa: F401
