"""``capwatch``: the command line. Each subcommand lives in ``capwatch/commands/<name>.py`` with
``register(subparsers)`` (cheap: no heavy imports) and does its real imports only when run, so
``capwatch plan`` works with torch alone and never loads FastAPI."""

from __future__ import annotations

import argparse
import importlib
import sys

# One line per subcommand module; each adds itself to the parser.
COMMAND_MODULES: tuple[str, ...] = (
    "capwatch.commands.plan",
    "capwatch.commands.serve",
    "capwatch.commands.advise",
)


class CommandError(Exception):
    """A user mistake: printed as one clear line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="capwatch",
        description="Telemetry and tuning advice for the per-rank token cap of MoE all-to-all dispatch.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (CommandError, ValueError) as error:
        # SizingError and pydantic's ValidationError are ValueErrors: bad input, not a crash.
        print(f"capwatch {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
