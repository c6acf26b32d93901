"""Issue #36, finding 7 (F17, F14): no URL or host check raises, and every host setting is validated to one that can
work, in one line naming the setting. ``urlsplit`` raised ValueError for ``http://[::1`` and its kin: ``capwatch
advise --url`` ended in a traceback, the plugin's load raised ValueError instead of its SettingsError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.telemetry.endpoint import bind_host_problem, host_name_problem, http_url_problem
from capwatch.telemetry.exporter import ExporterOptions
from capwatch.telemetry.reporter import ReporterOptions

BROKEN_URLS = ["http://[::1", "http://[:1", "http://a]b:1", "http://[]:80", "http://[192.168.0.1]:1", "http://-1",
               "http://" + "a" * 100_000, "http://256.1.1.1:8321", "http://a..b:1", "http://-a.example:1"]


@pytest.mark.parametrize("url", BROKEN_URLS, ids=lambda url: url[:30])
def test_a_url_no_request_could_reach_is_refused_in_words(url):
    problem = http_url_problem(url)
    assert problem is not None and "\n" not in problem and len(problem) < 300
    with pytest.raises(ValueError, match="service_url"):
        ReporterOptions(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8321", "https://[::1]:8321/", "http://capwatch.svc.cluster.local",
                                 "http://localhost:80", "http://a-b.example:1/prefix", "http://[fe80::1]:9"])
def test_urls_a_service_can_have_pass(url):
    assert http_url_problem(url) is None


@given(st.text(max_size=60).map(lambda text: "http://" + text))
def test_the_url_check_never_raises(url):
    http_url_problem(url)


@pytest.mark.parametrize("host", ["\x00", "256.1.1.1", "evil.example", "-", "", "a" * 300])
def test_an_exporter_host_that_cannot_be_listened_on_is_refused(host):
    assert bind_host_problem(host) is not None
    with pytest.raises(ValueError, match="exporter host"):
        ExporterOptions(host=host)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "10.1.2.3"])
def test_an_exporter_host_to_listen_on_passes(host):
    ExporterOptions(host=host)


@pytest.mark.parametrize("environ, words", [
    ({"CAPWATCH_SERVICE_URL": "http://[::1"}, "CAPWATCH_SERVICE_URL='http://[::1': it is not a URL"),
    ({"CAPWATCH_SERVICE_URL": "http://-1"}, "CAPWATCH_SERVICE_URL='http://-1': its host"),
    ({"CAPWATCH_SERVICE_URL": "http://" + "a" * 100_000}, "characters long"),
    ({"CAPWATCH_METRICS_HOST": "\x00"}, "CAPWATCH_METRICS_HOST"),
    ({"CAPWATCH_METRICS_HOST": "256.1.1.1"}, "not an IPv4 address"),
    ({"CAPWATCH_METRICS_HOST": "-"}, "CAPWATCH_METRICS_HOST"),
    ({"CAPWATCH_METRICS_HOST": "evil.example"}, "not an address to listen on"),
])
def test_the_plugins_settings_name_the_variable_in_one_line(environ, words):
    from capwatch.sglang_plugin.settings import SettingsError, load

    with pytest.raises(SettingsError) as raised:
        load({"CAPWATCH_CLUSTER": "c", **environ})
    message = str(raised.value)
    assert words in message and "\n" not in message and len(message) < 600


def test_host_names_of_labels_pass_and_dotted_numbers_must_be_an_address():
    assert host_name_problem("node-7.rack2.example") is None
    assert host_name_problem("1.2.3.4") is None
    assert "IPv4" in host_name_problem("1.2.3.400")
