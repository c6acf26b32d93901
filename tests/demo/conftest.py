"""Real processes for the demo tests: ``capwatch serve`` and ``capwatch demo`` as subprocesses on
free loopback ports, each in its own process group that teardown kills."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from capwatch.demo.ports import free_port, free_port_block  # noqa: F401  (re-exported for the tests)
from capwatch.demo.session import DEMO_ADVISOR_SETTINGS
from capwatch.demo.trace import write_trace
from capwatch.demo.workload import Workload

REPO_ROOT = Path(__file__).resolve().parents[2]


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return env


def run_capwatch(*args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, "-m", "capwatch", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=environment(), cwd=REPO_ROOT,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"capwatch {' '.join(args)} ran past {timeout_s} s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def write_timed_trace(path: Path, token_counts: list[list[int]], seconds_per_step: float) -> Path:
    with path.open("w") as handle:
        write_trace(Workload(token_counts, [round(step * seconds_per_step, 3) for step in range(len(token_counts))]),
                    handle)
    return path


@pytest.fixture(scope="module")
def service_process(tmp_path_factory):
    """``capwatch serve`` on a free port, with the demo's compressed advisor clock."""
    from capwatch.demo.service import ServiceProcess

    folder = tmp_path_factory.mktemp("service")
    process = ServiceProcess(folder / "capwatch.db", env=DEMO_ADVISOR_SETTINGS).start(timeout_s=60)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def service(service_process):
    """The URL of ``service_process``."""
    return service_process.url


def final_reports(database: Path, cluster: str) -> dict[int, int]:
    """How many final reports each rank of ``cluster`` sent, from the service's own database."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        rows = connection.execute(
            "SELECT ep_rank, SUM(json_extract(payload, '$.final') = 1) FROM reports WHERE cluster = ? "
            "GROUP BY ep_rank", (cluster,)).fetchall()
    return dict(rows)
