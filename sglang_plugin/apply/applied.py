"""What the launcher applied, handed to the schedulers through the environment they inherit.

The launcher (``CAPWATCH_APPLY``, ``apply/``) resolves each cap variable once, inside SGLang's resolution, and
records here what the variable now holds and where it came from; every scheduler process SGLang spawns inherits
``os.environ`` and reads it back to report its dispatcher's cap, its source and the advice revision. One JSON
object per cap variable, ``CAPWATCH_APPLIED_<cap variable>``; standard library only.

Sources: ``capwatch`` (the launcher set the variable from advice), ``operator`` (set before capwatch ran, kept),
``default`` (unset: SGLang's own default; ``cap`` is None when that default is computed by SGLang).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass

logger = logging.getLogger("capwatch.sglang")

PREFIX = "CAPWATCH_APPLIED_"
SOURCES = ("capwatch", "operator", "default")
REASON_MAX_CHARS = 500  # one log line's worth: the reason travels in every child's environment
_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]{0,127}")


@dataclass(frozen=True)
class Applied:
    """A cap variable's value at start, where it came from, the advice revision (None without advice) and why."""

    cap: int | None
    source: str
    revision: int | None
    reason: str

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"applied source {self.source!r} is not one of {', '.join(SOURCES)}")
        for name in ("cap", "revision"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < (1 if name == "cap" else 0)):
                raise ValueError(f"applied {name} {value!r} is not a{' positive' if name == 'cap' else ''} integer")
        if self.source == "capwatch" and (self.cap is None or self.revision is None):
            raise ValueError("a cap applied by capwatch has a value and an advice revision")
        if not isinstance(self.reason, str):
            raise ValueError(f"applied reason {self.reason!r} is not text")


def key(variable: str) -> str:
    """The environment variable that carries ``variable``'s record."""
    if not _VARIABLE.fullmatch(variable):
        raise ValueError(f"{variable!r} is not a cap variable name (upper case letters, digits, _)")
    return PREFIX + variable


def record_applied(variable: str, cap: int | None, source: str, revision: int | None, reason: str,
                   environ: MutableMapping[str, str] = os.environ) -> Applied:
    """Record what ``variable`` holds at start for the processes started after this one; returns the record."""
    applied = Applied(cap, source, revision, " ".join(reason.split())[:REASON_MAX_CHARS])
    environ[key(variable)] = json.dumps(asdict(applied), separators=(",", ":"), sort_keys=True)
    return applied


def read_applied(variable: str, environ: Mapping[str, str] = os.environ) -> Applied | None:
    """The record for ``variable``, or None where none was made (capwatch applied nothing: no ``CAPWATCH_APPLY``,
    an older launcher) or the one found cannot be read (one warning line: a scheduler never fails on it)."""
    raw = environ.get(key(variable))
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
        if not isinstance(fields, dict) or set(fields) != {"cap", "source", "revision", "reason"}:
            raise ValueError("not the four fields cap, source, revision, reason")
        return Applied(**fields)
    except ValueError as error:  # json.JSONDecodeError is one
        logger.warning("capwatch: %s=%r cannot be read (%s); its cap's source is reported unknown",
                       key(variable), raw[:80], error)
        return None


def clear_applied(variable: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """Forget a record inherited from a parent launcher before this launcher resolves ``variable`` again."""
    environ.pop(key(variable), None)
