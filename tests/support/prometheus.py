"""A real Prometheus (the Debian package) for the live tests, started the one way every suite shares.

``start_prometheus(workdir, config)`` writes the config into ``workdir``, keeps the TSDB there, binds a
free loopback port (Prometheus cannot take a bound socket, so a port can be lost to another process
between the probe and the bind: then it retries on a new one), waits for ``/-/ready`` and returns a
``PrometheusServer``. ``stop()`` (or leaving the ``with`` block) ends its process group. Its log goes to
``workdir/prometheus-N.log``; the test process never keeps that file open.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support.ports import LOOPBACK, free_port

READY_TIMEOUT_S = 60.0
START_ATTEMPTS = 3
RANKS_JOB = "capwatch-ranks"  # the job name of dashboards/prometheus.yml (MoeA2ARankDown watches it)

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only: never a proxy


class PrometheusNotInstalled(RuntimeError):
    pass


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusNotInstalled(
            "prometheus is not on PATH: install the Debian package prometheus (make system-deps)")
    return binary


def scrape_config(targets: Sequence[str], *, job: str = RANKS_JOB, scrape_interval: str = "1s",
                  rule_files: Sequence[str] = (), extra_jobs: dict[str, Sequence[str]] | None = None) -> dict:
    """A config scraping ``targets`` (host:port) as ``job``, plus ``extra_jobs`` {job: targets}."""
    jobs = {job: list(targets), **{name: list(hosts) for name, hosts in (extra_jobs or {}).items()}}
    return {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{"job_name": name, "static_configs": [{"targets": hosts}]} for name, hosts in jobs.items()],
    }


class PrometheusServer:
    def __init__(self, process: subprocess.Popen, port: int, log: Path):
        self.process = process
        self.port = port
        self.log = log
        self.url = f"http://{LOOPBACK}:{port}"

    def log_tail(self, characters: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-characters:] if self.log.exists() else ""

    def query(self, promql: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with _opener.open(url, timeout=10) as response:
            body = json.load(response)
        if body["status"] != "success":
            raise AssertionError(f"{promql}: {body}")
        return body["data"]["result"]

    def wait_for(self, promql: str, predicate: Callable[[list[dict]], object],
                 timeout_s: float = 60.0) -> list[dict]:
        """The first result of ``promql`` that satisfies ``predicate``, polled until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        result: list[dict] | str = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.process.returncode}):\n{self.log_tail()}")
            try:
                result = self.query(promql)
                if predicate(result):
                    return result
            except OSError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"{promql}: still {result} after {timeout_s} s")

    def ready(self) -> bool:
        try:
            with _opener.open(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):  # refused while starting, 503 while loading the TSDB
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass

    def __enter__(self) -> "PrometheusServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_prometheus(workdir: Path, config: dict, *, binary: str | None = None,
                     ready_timeout_s: float = READY_TIMEOUT_S, attempts: int = START_ATTEMPTS,
                     extra_args: Sequence[str] = (), ports: Callable[[], int] = free_port) -> PrometheusServer:
    """Prometheus on a free loopback port with ``config`` (a dict; JSON is YAML) and its storage in
    ``workdir``, ready to answer queries. ``ports`` picks each attempt's port."""
    binary = binary or prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config, indent=1))
    failures = []
    for attempt in range(attempts):
        port = ports()
        log = workdir / f"prometheus-{attempt}.log"
        with log.open("wb") as output:  # the child keeps its own descriptor; ours closes here
            process = subprocess.Popen(
                [binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address={LOOPBACK}:{port}", *extra_args],
                stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        server = PrometheusServer(process, port, log)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            if server.ready():
                return server
            time.sleep(0.2)
        server.stop()
        failures.append(f"attempt {attempt} on port {port} (exit {process.returncode}):\n{server.log_tail(1500)}")
        if "address already in use" not in server.log_tail().lower():
            break  # not a lost port race: another try would fail the same way
    raise RuntimeError("prometheus did not become ready:\n" + "\n".join(failures))
