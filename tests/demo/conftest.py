"""Real processes for the demo tests: ``capwatch serve`` (``tests.support.service``) on a free loopback port, and
what the tests need around ``capwatch demo`` runs (``tests.support.launcher.run_capwatch``)."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from pathlib import Path

import pytest

from capwatch.demo.ports import free_port, free_port_block  # noqa: F401  (re-exported for the tests)
from capwatch.demo.session import DEMO_ADVISOR_SETTINGS
from capwatch.demo.trace import write_trace
from capwatch.demo.workload import Workload
from tests.support.service import ServiceProcess  # noqa: F401  (re-exported for the tests)


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
