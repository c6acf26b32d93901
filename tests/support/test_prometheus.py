"""The shared Prometheus launcher: ready when it returns, survives a lost port race, leaves no file
handle or process behind."""

from __future__ import annotations

import os
import socket

import pytest

from tests.support.ports import LOOPBACK, free_port, free_port_pair
from tests.support.prometheus import PrometheusNotInstalled, prometheus_binary, scrape_config, start_prometheus


@pytest.fixture(scope="module")
def binary() -> str:
    try:
        return prometheus_binary()
    except PrometheusNotInstalled as error:
        pytest.fail(str(error))


def open_files() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def test_started_ready_scraping_itself_and_gone_after_stop(tmp_path, binary):
    with start_prometheus(tmp_path, scrape_config([], job="self", extra_jobs={"prometheus": []}),
                          binary=binary) as prometheus:
        # Ready means queries are answered right away; its own log is not held open by this process.
        assert prometheus.query("vector(1)")[0]["value"][1] == "1"
        assert str(prometheus.log) not in open_files()
        pid = prometheus.process.pid
    assert prometheus.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone


def test_a_port_lost_to_another_process_is_retried_on_a_new_one(tmp_path, binary):
    with socket.socket() as squatter:
        squatter.bind((LOOPBACK, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        with start_prometheus(tmp_path, scrape_config([]), binary=binary,
                              ports=lambda: next(picks, None) or free_port()) as prometheus:
            assert prometheus.port != taken and prometheus.ready()
            assert "address already in use" in (tmp_path / "prometheus-0.log").read_text().lower()


def test_a_bad_config_fails_at_once_with_its_log(tmp_path, binary):
    with pytest.raises(RuntimeError, match="did not become ready") as error:
        start_prometheus(tmp_path, {"global": {"scrape_interval": "banana"}}, binary=binary, ready_timeout_s=30)
    assert "attempt 1" not in str(error.value) and "banana" in str(error.value)  # no second try; the log says why


def test_free_port_pair_is_two_adjacent_bindable_ports():
    base = free_port_pair()
    with socket.socket() as first, socket.socket() as second:
        first.bind((LOOPBACK, base))
        second.bind((LOOPBACK, base + 1))
