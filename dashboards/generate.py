"""Write the capwatch Grafana dashboards as JSON: ``python -m capwatch.dashboards.generate [--check] [--out DIR]``.

The JSON under ``dashboards/grafana/`` is committed so Grafana users can import or provision it without Python;
``--check`` (and the test suite) fails when it no longer matches what this script generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dashboard_models

from capwatch.dashboards import overview, panels, rank_detail

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
# Only a checkout (pyproject.toml beside the dashboards/ folder) writes there by default: in an installed capwatch
# that folder is inside site-packages, where regenerated JSON would be lost or refused.
IN_CHECKOUT = (GRAFANA_DIR.parents[1] / "pyproject.toml").is_file()
DASHBOARDS: dict[str, Callable[[], dashboard_models.Dashboard]] = {
    "ep-group-overview.json": overview.build,
    "ep-rank-detail.json": rank_detail.build,
}


GRAFANA_VERSION = "11.6.0"  # the grafana-foundation-sdk build pinned in pyproject's dashboards extra


def importable(dashboard: dict) -> dict:
    """Grafana's export envelope, so "Import dashboard" asks which Prometheus to use (``__inputs``: the datasource
    variable's starting value) and says what the dashboard needs (``__requires``). The dashboard keeps its uid, so
    a re-import replaces it; provisioning reads the same file (the envelope is ignored there)."""
    panel_types = sorted({panel["type"] for panel in _panels(dashboard.get("panels", []))} - {"row"})
    dashboard["__inputs"] = [{"name": panels.IMPORT_INPUT, "label": "Prometheus", "type": "datasource",
                              "pluginId": "prometheus", "pluginName": "Prometheus",
                              "description": "The Prometheus that scrapes the ranks and the capwatch service."}]
    dashboard["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        *({"type": "panel", "id": kind, "name": kind, "version": ""} for kind in panel_types)]
    return dashboard


def _panels(items: list) -> list[dict]:
    return [panel for item in items for panel in [item, *_panels(item.get("panels", []))]]


def render(build: Callable[[], dashboard_models.Dashboard]) -> str:
    """Stable text: sorted keys and a trailing newline, so regenerating an unchanged dashboard is a no-op."""
    dashboard = importable(json.loads(json.dumps(build(), cls=JSONEncoder)))
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def render_all() -> dict[str, str]:
    return {file_name: render(build) for file_name, build in DASHBOARDS.items()}


def stale_files(directory: Path = GRAFANA_DIR) -> list[str]:
    """File names under ``directory`` that are missing or differ from what the generator writes now."""
    return [
        file_name for file_name, text in render_all().items()
        if not (directory / file_name).is_file() or (directory / file_name).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capwatch.dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help=f"directory to write (default, in a checkout: {GRAFANA_DIR}; "
                                                 "needed with an installed capwatch)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the JSON there is stale")
    args = parser.parse_args(argv)
    if args.out is None and not args.check and not IN_CHECKOUT:
        parser.error(f"--out DIR is needed: this capwatch is installed, and its own {GRAFANA_DIR} is inside the "
                     "package; write the dashboards elsewhere, e.g. --out ./grafana")
    args.out = args.out or GRAFANA_DIR
    if args.check:
        stale = stale_files(args.out)
        for file_name in stale:
            print(f"stale: {args.out / file_name} (run python -m capwatch.dashboards.generate)", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for file_name, text in render_all().items():
        (args.out / file_name).write_text(text)
        print(args.out / file_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
