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
    "capwatch.commands.demo",
)


class CommandError(Exception):
    """A user mistake: printed as one clear line, exit code 2, no traceback."""


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (the standard parser prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")




def validation_error_line(error) -> str:
    """A pydantic ValidationError (many lines, a docs URL) as one line: ``field: message; ...``."""
    return "; ".join(f"{'.'.join(str(part) for part in item['loc']) or 'input'}: "
                     f"{item['msg'].removeprefix('Value error, ')}" for item in error.errors())


def usage_error(error: Exception) -> str | None:
    """The one-line message for a user mistake, or None for a bug (which keeps its traceback).
    SizingError and pydantic's ValidationError are recognised only if their module is loaded,
    so the CLI itself imports neither."""
    if isinstance(error, CommandError):
        return str(error)
    sizing = sys.modules.get("capwatch.sizing.checks")
    if sizing is not None and isinstance(error, sizing.SizingError):
        return str(error)
    pydantic_core = sys.modules.get("pydantic_core")
    if pydantic_core is not None and isinstance(error, pydantic_core.ValidationError):
        return validation_error_line(error)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    except Exception as error:
        message = usage_error(error)
        if message is None:
            raise  # a bug, not bad input: keep the traceback and exit 1
        print(f"capwatch {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
