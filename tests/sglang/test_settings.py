"""The plugin's pieces that need no SGLang: CAPWATCH_* settings, the release rule, merged role series."""

from __future__ import annotations

import pytest
from capwatch.sglang_plugin import releases
from capwatch.sglang_plugin.hooks import flashinfer as flashinfer_hooks
from capwatch.sglang_plugin.settings import PluginSettings, SettingsError, load
from capwatch.agent.status import RolesCollector
from capwatch.sglang_plugin.status import plugin_status
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily


def test_defaults_export_on_loopback_and_report_nowhere():
    settings = load({})
    assert settings == PluginSettings()
    assert settings.reporter() is None
    options = settings.exporter(3)
    assert (options.host, options.port) == ("127.0.0.1", 9473)  # base port + local GPU index


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
    # Issue #20, finding 5: finite but harmful values, and a URL or token every send would fail with.
    ({"CAPWATCH_REPORT_INTERVAL_S": "1e10"}, "CAPWATCH_REPORT_INTERVAL_S='1e10' is outside 0.5..3600 seconds"),
    ({"CAPWATCH_REPORT_INTERVAL_S": "1e-300"}, "CAPWATCH_REPORT_INTERVAL_S='1e-300' is outside 0.5..3600 seconds"),
    ({"CAPWATCH_FINAL_REPORT_TIMEOUT_S": "1e9"}, "CAPWATCH_FINAL_REPORT_TIMEOUT_S='1e9' is outside 0.1..60 seconds"),
    ({"CAPWATCH_SERVICE_URL": "http://monitor:abc"}, "CAPWATCH_SERVICE_URL='http://monitor:abc': its port 'abc'"),
    ({"CAPWATCH_SERVICE_URL": "http://monitor:8321/\r\nX: y"}, "CAPWATCH_SERVICE_URL"),
    ({"CAPWATCH_SERVICE_URL": "http://monitor\x00:8321"}, "CAPWATCH_SERVICE_URL"),
    ({"CAPWATCH_SERVICE_URL": "http://m:1", "CAPWATCH_TOKEN": "s3cret\r\nX-Evil: 1"}, "CAPWATCH_TOKEN: it contains"),
    ({"CAPWATCH_SERVICE_URL": "http://m:1", "CAPWATCH_TOKEN": "s3cr\u00e9t\u2603"}, "CAPWATCH_TOKEN: it contains non-ASCII"),
])
def test_a_bad_variable_is_one_clear_line_naming_it(environ, names):
    with pytest.raises(SettingsError) as error:
        load(environ)
    message = str(error.value)
    assert names in message and "\n" not in message and "\r" not in message
    assert "s3cr" not in message  # a token's value is never echoed


@pytest.mark.parametrize("raw, allowed", [("1", True), ("true", True), ("0", False), ("", False)])
def test_the_newer_release_switch(raw, allowed):
    assert load({"CAPWATCH_ALLOW_NEWER_SGLANG": raw}).allow_newer_sglang is allowed


def test_the_newer_release_switch_takes_only_one_or_zero():
    with pytest.raises(SettingsError, match="CAPWATCH_ALLOW_NEWER_SGLANG='yes' must be 1 or 0"):
        load({"CAPWATCH_ALLOW_NEWER_SGLANG": "yes"})


@pytest.mark.parametrize("version", releases.VERIFIED)
def test_each_verified_release_runs_on_its_own_adapters(version):
    for allow_newer in (False, True):
        assert releases.choose(version, allow_newer) == releases.ReleaseChoice(version, version)
    assert version in flashinfer_hooks.ADAPTERS


@pytest.mark.parametrize("version", ["0.5.24", "0.5.23.post1", "0.6.0", "0.5.24rc1", "1.0.0"])
def test_a_newer_release_only_on_opt_in_and_then_on_the_newest_adapters(version):
    reason = releases.choose(version, allow_newer=False)
    assert isinstance(reason, str) and "CAPWATCH_ALLOW_NEWER_SGLANG=1" in reason and "newer" in reason
    assert releases.choose(version, allow_newer=True) == releases.ReleaseChoice(version, releases.NEWEST, newer=True)


@pytest.mark.parametrize("version", ["0.5.18", "0.5.13", "0.4.9", "0.5.23rc1", None, "nightly"])
def test_an_older_or_unreadable_release_never_runs(version):
    for allow_newer in (False, True):
        reason = releases.choose(version, allow_newer)
        assert isinstance(reason, str) and "capwatch is verified on sglang 0.5.19" in reason


@pytest.mark.parametrize("release, flashinfer, newer, supported", [
    ("0.5.19", "0.6.18", False, True), ("0.5.21", "0.6.18.post1", False, True),
    ("0.5.21", "0.7.1", False, False),  # 0.7.1 is 0.5.22's pin, not 0.5.21's
    ("0.5.22", "0.7.1", False, True), ("0.5.22", "0.7.2", False, False),
    ("0.5.23", "0.7.2", False, True), ("0.5.23", "0.7.2.post1", False, True), ("0.5.23", "0.7.4", False, False),
    ("0.5.23", None, False, False),
    ("0.5.23", "0.6.18", True, True),  # a newer SGLang: any FlashInfer whose MoeAlltoAll capwatch knows
    ("0.5.23", "0.7.4", True, False),  # 0.7.4 has no MoeAlltoAll
])
def test_each_release_with_its_flashinfer_pin(release, flashinfer, newer, supported):
    reason = flashinfer_hooks.problem(flashinfer_hooks.ADAPTERS[release], flashinfer, newer)
    if supported:  # the version passes; the targets are checked next (no sglang here)
        assert reason is None or "flashinfer-python" not in reason
    else:
        assert reason is not None and f"flashinfer-python {flashinfer} is not supported" in reason


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
    registry.register(plugin_status("enabled", "", {"sglang": "0.5.23", "flashinfer": None}))
    registry.register(roles)
    roles.collectors += [_Role("target", 4), _Role("draft", 1)]  # roles arrive after registration
    text = generate_latest(registry).decode()
    assert 'moe_a2a_dispatch_calls_total{dispatcher="target"} 4.0' in text
    assert 'moe_a2a_dispatch_calls_total{dispatcher="draft"} 1.0' in text
    assert text.count("# TYPE moe_a2a_dispatch_calls_total counter") == 1
    assert 'capwatch_sglang_plugin_info{flashinfer_version="none",reason="",sglang_version="0.5.23",state="enabled"}' in text


def test_the_legacy_cluster_label_switch_reaches_the_exporter():
    """CAPWATCH_LEGACY_CLUSTER_LABEL=1: the scheduler's exporter serves the group's old label beside the new one."""
    from capwatch.telemetry.exporter import RankExporter
    from prometheus_client.core import GaugeMetricFamily

    class Group:
        def collect(self):
            family = GaugeMetricFamily("moe_a2a_probe_tokens", "A probe.", labels=["ep_group"])
            family.add_metric(["prod-a"], 1)
            yield family

    assert load({}).exporter(0).legacy_group_label is False
    options = load({"CAPWATCH_LEGACY_CLUSTER_LABEL": "1"}).exporter(0)
    assert options.legacy_group_label is True
    text = RankExporter(Group(), legacy_group_label=options.legacy_group_label).render().decode()
    assert 'moe_a2a_probe_tokens{cluster="prod-a",ep_group="prod-a"} 1.0' in text
    assert 'moe_a2a_probe_tokens{ep_group="prod-a"} 1.0' in RankExporter(Group()).render().decode()
    with pytest.raises(SettingsError, match="CAPWATCH_LEGACY_CLUSTER_LABEL='yes' must be 1 or 0"):
        load({"CAPWATCH_LEGACY_CLUSTER_LABEL": "yes"})
