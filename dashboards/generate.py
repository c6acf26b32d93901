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

from capwatch.dashboards import overview, rank_detail

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
DASHBOARDS: dict[str, Callable[[], dashboard_models.Dashboard]] = {
    "ep-group-overview.json": overview.build,
    "ep-rank-detail.json": rank_detail.build,
}


def render(build: Callable[[], dashboard_models.Dashboard]) -> str:
    """Stable text: sorted keys and a trailing newline, so regenerating an unchanged dashboard is a no-op."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


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
    parser.add_argument("--out", type=Path, default=GRAFANA_DIR, help="directory to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the JSON there is stale")
    args = parser.parse_args(argv)
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
