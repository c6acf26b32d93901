"""The plugin's pieces that need no SGLang: CAPWATCH_* settings, the version rule, merged role series."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily

from capwatch.sglang_plugin import compat
from capwatch.sglang_plugin.settings import PluginSettings, SettingsError, load
from capwatch.sglang_plugin.status import PluginStatusCollector, RolesCollector


def test_defaults_export_on_loopback_and_report_nowhere():
    settings = load({})
    assert settings == PluginSettings()
    assert settings.reporter() is None
    options = settings.exporter(3)
    assert (options.host, options.port) == ("127.0.0.1", 9403)  # base port + local GPU index


def test_every_variable_is_read():
    settings = load({"CAPWATCH_SERVICE_URL": "http://127.0.0.1:8321", "CAPWATCH_CLUSTER": "prod-a",
                     "CAPWATCH_TOKEN": "t0k", "CAPWATCH_METRICS_BASE_PORT": "19000", "CAPWATCH_METRICS_HOST": "0.0.0.0",
                     "CAPWATCH_REPORT_INTERVAL_S": "2.5", "CAPWATCH_FINAL_REPORT_TIMEOUT_S": "4"})
    reporter = settings.reporter()
    assert (reporter.service_url, reporter.interval_s, reporter.bearer_token) == ("http://127.0.0.1:8321", 2.5, "t0k")
    assert (settings.cluster, settings.final_report_timeout_s, settings.exporter(1).port) == ("prod-a", 4.0, 19001)


@pytest.mark.parametrize("environ, names", [
    ({"CAPWATCH_METRICS_BASE_PORT": "ninety"}, "CAPWATCH_METRICS_BASE_PORT"),
    ({"CAPWATCH_METRICS_BASE_PORT": "70000"}, "CAPWATCH_METRICS_BASE_PORT"),
    ({"CAPWATCH_REPORT_INTERVAL_S": "soon"}, "CAPWATCH_REPORT_INTERVAL_S"),
    ({"CAPWATCH_SERVICE_URL": "monitor:8321"}, "CAPWATCH_SERVICE_URL"),
    ({"CAPWATCH_SERVICE_URL": "http://m:1", "CAPWATCH_REPORT_INTERVAL_S": "0"}, "CAPWATCH_REPORT_INTERVAL_S"),
    ({"CAPWATCH_CLUSTER": "prod a"}, "CAPWATCH_CLUSTER"),
    ({"CAPWATCH_FINAL_REPORT_TIMEOUT_S": "-1"}, "CAPWATCH_FINAL_REPORT_TIMEOUT_S"),
    ({"CAPWATCH_FINAL_REPORT_TIMEOUT_S": "inf"}, "CAPWATCH_FINAL_REPORT_TIMEOUT_S"),
    ({"CAPWATCH_SERVICE_URL": "http://m:1", "CAPWATCH_REPORT_INTERVAL_S": "nan"}, "CAPWATCH_REPORT_INTERVAL_S"),
])
def test_a_bad_variable_is_one_clear_line_naming_it(environ, names):
    with pytest.raises(SettingsError) as error:
        load(environ)
    message = str(error.value)
    assert names in message and "\n" not in message


@pytest.mark.parametrize("found, supported", [
    ({"sglang": "0.5.23", "flashinfer": "0.7.2"}, True),
    ({"sglang": "0.5.23", "flashinfer": "0.7.2.post1"}, True),
    ({"sglang": "0.5.22", "flashinfer": "0.7.2"}, False),
    ({"sglang": "0.5.23", "flashinfer": "0.7.4"}, False),
    ({"sglang": "0.5.23", "flashinfer": None}, False),
    ({"sglang": None, "flashinfer": "0.7.2"}, False),
])
def test_only_the_releases_the_plugin_was_written_against(found, supported):
    reason = compat.unsupported_reason(found)
    assert (reason is None) == supported
    if reason:
        assert "not supported" in reason


class _Role:
    def __init__(self, role: str, calls: int):
        self.role, self.calls = role, calls

    def collect(self):
        family = CounterMetricFamily("moe_a2a_dispatch_calls", "calls", labels=["dispatcher"])
        family.add_metric([self.role], self.calls)
        yield family


def test_roles_share_one_registry_told_apart_by_their_label():
    roles = RolesCollector()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PluginStatusCollector("enabled", "", {"sglang": "0.5.23", "flashinfer": None}))
    registry.register(roles)
    roles.collectors += [_Role("target", 4), _Role("draft", 1)]  # roles arrive after registration
    text = generate_latest(registry).decode()
    assert 'moe_a2a_dispatch_calls_total{dispatcher="target"} 4.0' in text
    assert 'moe_a2a_dispatch_calls_total{dispatcher="draft"} 1.0' in text
    assert text.count("# TYPE moe_a2a_dispatch_calls_total counter") == 1
    assert 'capwatch_sglang_plugin_info{flashinfer_version="none",reason="",sglang_version="0.5.23",state="enabled"}' in text
