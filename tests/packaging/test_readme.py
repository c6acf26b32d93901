"""The README says what the code does: its metric and endpoint lists equal the code's."""

from __future__ import annotations

import re

from capwatch.dashboards.service_metrics import SERVICE_METRICS
from capwatch.telemetry import catalogue

from tests.support.checkout import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _paragraph(starting_with: str) -> str:
    start = README.index(starting_with)
    end = README.find("\n\n", start)
    return README[start:end if end >= 0 else len(README)]


def _names(text: str, prefix: str) -> list[str]:
    return re.findall(rf"`({prefix}[a-z0-9_]+)`", text)


def test_the_readme_lists_exactly_the_per_rank_metrics_in_catalogue_order():
    listed = _names(_paragraph("- **Metrics**").split("Per rank:", 1)[1].split(".", 1)[0], "moe_a2a_")
    assert listed == [spec.name for spec in catalogue.METRICS]


def test_the_readme_lists_exactly_the_services_metrics():
    listed = _names(_paragraph("The service's own metrics").split(":", 1)[1], "capwatch_")
    assert listed == list(SERVICE_METRICS)


def readme_endpoints() -> set[tuple[str, str]]:
    """``Endpoints: `POST /v1/reports`, `GET /v1/clusters`, `/v1/clusters/{cluster}`, `/advice`, ...``: a
    path without a method takes the previous one's; one not under /v1 after a cluster path hangs off it."""
    sentence = _paragraph("Settings are `CAPWATCH_*`").split("Endpoints:", 1)[1]
    endpoints, method, base = set(), "GET", ""
    for item in re.findall(r"`([^`]+)`", sentence):
        parts = item.split()
        if len(parts) == 2:
            method, item = parts
        path = item.split("?", 1)[0]
        if path.startswith("/v1/"):
            base = path if "{cluster}" in path else base
        elif path not in ("/healthz", "/metrics") and base:
            path = base + path
        endpoints.add((method, path))
    return endpoints


def test_the_readme_lists_exactly_the_services_endpoints(tmp_path):
    """Against the API the service documents (its OpenAPI schema; the page and /docs are not API)."""
    from capwatch.service.config import Settings
    from capwatch.service.main import create_app

    schema = create_app(Settings(db_path=tmp_path / "readme.db")).openapi()
    served = {(method.upper(), path) for path, operations in schema["paths"].items() for method in operations}
    assert readme_endpoints() == served
