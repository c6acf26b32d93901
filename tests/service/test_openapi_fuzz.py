"""Schemathesis over the service's own OpenAPI, in process through the ASGI app: no input,
however odd, gets a 5xx. Bounded (few examples per operation) so it stays well under a minute."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from capwatch.service.config import Settings
from capwatch.service.main import create_app, store_options
from tests.support.simulate import SimulatedRank
from capwatch.service.store.sqlite import Store
from capwatch.telemetry.report import RankReport

_directory = Path(tempfile.mkdtemp(prefix="capwatch-fuzz-"))
_settings = Settings(db_path=_directory / "fuzz.db", allowed_hosts=["testserver"])  # the ASGI client's Host
_store = Store(_settings.db_path, store_options(_settings))
atexit.register(lambda: (_store.close(), shutil.rmtree(_directory, ignore_errors=True)))
# One known cluster with history, so the cluster routes run their real code, not only the 404.
_ranks = [SimulatedRank("c1", rank, 2, cap=1024) for rank in range(2)]
_start = time.time() - 3600
for _window in range(30):
    for _rank in _ranks:
        _report = _rank.report(_start + 60 * _window, _start + 60 * _window + 59, [100, 200 + _window])
        _store.submit(RankReport.model_validate_json(json.dumps(_report)))
_store.run_in_writer(lambda _: None).result()  # everything above is committed
app = create_app(_settings, store=_store)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_server_error(case):
    response = case.call()
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"


def test_allowed_hosts_that_refuse_everything_are_refused_in_one_line(tmp_path):
    """Issue #36 (F14): CAPWATCH_ALLOWED_HOSTS='[]' answered 421 to everything, /healthz too."""
    import subprocess

    from tests.support.launcher import run_capwatch

    result = run_capwatch("serve", "--port", "18998", "--db", str(tmp_path / "c.db"),
                          env={"CAPWATCH_ALLOWED_HOSTS": "[]"}, timeout_s=60)
    assert result.returncode == 2 and "CAPWATCH_ALLOWED_HOSTS" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    del subprocess


def test_an_origin_that_is_no_url_is_refused_not_a_500(client):
    """urlsplit raised on Origin 'http://[::1' inside the report rules."""
    response = client.post("/v1/reports", content="{}", headers={"Origin": "http://[::1"})
    assert response.status_code == 403, response.text
