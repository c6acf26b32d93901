"""What the SGLang plugin tests share around a group of ranks: the plugin's environment, and the run to the pause
(metrics scraped, the service's view and advice read) then on to the overflow that ends rank 0."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from tests.sglang.ranks import START_TIMEOUT_S, RankRun


def get_json(url: str):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


def wait_for(check, timeout_s: float = 60.0):
    """``check()`` once it passes: retried while it fails an assertion, or while the service does not know the
    cluster yet (404: no rank's first report has arrived, which under load comes after the ranks are ready)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except (AssertionError, urllib.error.HTTPError) as error:
            if isinstance(error, urllib.error.HTTPError) and error.code != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def plugin_env(cluster: str, base_port: int, service_url: str, caps: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that turns the capwatch plugin on in every rank: its cluster, metrics ports from
    ``base_port``, reports to ``service_url`` every 0.5 s; ``caps`` the backend's cap variables."""
    return {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": cluster, "CAPWATCH_METRICS_BASE_PORT": str(base_port),
            "CAPWATCH_SERVICE_URL": service_url, "CAPWATCH_REPORT_INTERVAL_S": "0.5", **(caps or {})}


def scrape_at_pause_then_overflow(run: RankRun, service, cluster: str, view) -> tuple[dict, dict, dict, int]:
    """At the plan's pause: every rank's metrics, ``view(service, cluster)`` once it passes (the ranks' logs added
    to its failure) and the cluster's advice; then ``resume`` and rank 0's exit code after the overflow step. The
    ranks are killed however it ends (rank 1 waits in the collective rank 0 never joined)."""
    try:
        run.wait_ready("paused")
        scraped = {rank: run.metrics(rank) for rank in range(run.world)}
        try:
            viewed = wait_for(lambda: view(service, cluster))
        except AssertionError as error:
            raise AssertionError(f"{error}\n{run.logs()}") from None
        advice = get_json(f"{service.url}/v1/clusters/{cluster}/advice")
        (run.run_dir / "resume").write_text("")
        code = run.processes[0].wait(timeout=START_TIMEOUT_S)
    finally:
        run.kill()
    return scraped, viewed, advice, code
