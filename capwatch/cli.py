"""``capwatch``: the command line. Each subcommand lives in ``capwatch/commands/<name>.py`` with
``register(subparsers)`` (cheap: no heavy imports) and does its real imports only when run, so
``capwatch plan`` works with torch alone and never loads FastAPI. A user mistake is a ``CommandError``
(``capwatch/usage_errors.py``, which the commands import; they never import this module): one line, exit 2.

Exit codes (docs/cli.md): 0 done; 1 a bug (a traceback) or, for ``demo --overflow-policy raise``, the
dispatcher's overflow; 2 a usage error (one line); 130 interrupted (Ctrl-C); 141 the reader of the output went
away (``| head``: quietly, as a program killed by SIGPIPE)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from capwatch.usage_errors import usage_error
from capwatch.version import capwatch_version

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
    parser.add_argument("--version", action="version", version=f"capwatch {capwatch_version()}",
                        help="print the installed version (a2a-capwatch) and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a program SIGPIPE ended


def _output_gone() -> int:
    """The reader of stdout went away (``capwatch ... | head -1``): end quietly. Python would print a
    BrokenPipeError when it flushes stdout at exit, so stdout is pointed at /dev/null first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout: nothing left to flush
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        code = _run(args)
        sys.stdout.flush()  # a pipe closed early fails here, not at exit
        return code
    except BrokenPipeError:
        return _output_gone()


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args) or 0)
    except BrokenPipeError:
        raise
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
