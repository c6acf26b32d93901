"""User mistakes on the command line: ``CommandError`` and the one line each prints.

The subcommands (``capwatch/commands/``) and the demo raise ``CommandError``; ``capwatch.cli.main``
prints what :func:`usage_error` makes of it, one line, exit 2. A module of its own, importing nothing
of capwatch, so every command imports it at the top without importing the CLI that imports them."""

from __future__ import annotations

import sys


class CommandError(Exception):
    """A user mistake: printed as one clear line, exit code 2, no traceback."""


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
