"""A real Prometheus server (the Debian package) scraping given targets, for the live tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[str], scrape_interval_ms: int = 1000):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: run `make system-deps` (Debian package prometheus)")
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": f"{scrape_interval_ms}ms", "scrape_timeout": f"{scrape_interval_ms}ms"},
            "scrape_configs": [{"job_name": "capwatch-ranks", "static_configs": [{"targets": targets}]}],
        }))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, predicate, timeout_s: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        result: list[dict] | str = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                result = self.query(promql)
                if predicate(result):
                    return result
            except OSError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"{promql}: still {result} after {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
