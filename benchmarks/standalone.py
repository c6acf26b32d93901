"""``python -m benchmarks.<name> [--quick] [--json]`` for one benchmark module, without the runner's report."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def standalone(prog: str, doc: str | None, run: Callable[..., dict], render: Callable[[dict], None] | None = None,
               argv: list[str] | None = None, quick_help: str = "fewer iterations (a smoke run)") -> None:
    """Parse ``--quick``/``--json``, run, and print the figures: as JSON, or with ``render`` when given."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").strip().split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    figures = run(quick=args.quick)
    if args.json or render is None:
        print(json.dumps(figures, indent=2))
    else:
        render(figures)
