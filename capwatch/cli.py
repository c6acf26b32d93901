"""``capwatch``: the command line. Each subcommand lives in ``capwatch/commands/<name>.py`` with
``register(subparsers)`` (cheap: no heavy imports) and does its real imports only when run, so
``capwatch plan`` works with torch alone and never loads FastAPI. A user mistake is a ``CommandError``
(``capwatch/usage_errors.py``, which the commands import; they never import this module): one line, exit 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from capwatch.usage_errors import usage_error

# One line per subcommand module; each adds itself to the parser.
COMMAND_MODULES: tuple[str, ...] = (
    "capwatch.commands.plan",
    "capwatch.commands.serve",
    "capwatch.commands.advise",
    "capwatch.commands.demo",
    "capwatch.commands.dashboards",
)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (the standard parser prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
