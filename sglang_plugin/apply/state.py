"""Overflows at caps capwatch applied, kept across restarts in one small JSON file (``CAPWATCH_APPLY_STATE_FILE``,
default ``$XDG_STATE_HOME/capwatch/apply-state.json``): a later start never applies that cap or a lower one again
until advice newer than the overflow (its revision, a generation time, later than the overflow) says so.

A scheduler whose dispatcher overflowed at a cap the launcher applied records it (``record_overflow``); the
launcher reads it before applying (``blocking``). Written whole to a temporary file and renamed, so a crash
leaves the old file or the new one; a file that cannot be read blocks nothing and is said so in the line.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Overflow:
    variable: str
    cap: int  # the applied cap the dispatcher overflowed at
    revision: int  # the advice revision that applied it
    at_unix_s: float  # when the overflow was recorded


def _read(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return found if isinstance(found, dict) else {}


def blocking(path: Path, variable: str) -> Overflow | None:
    """The overflow recorded for ``variable``, or None; ValueError/OSError when the file cannot be read."""
    entry = _read(path).get(variable)
    if entry is None:
        return None
    try:
        return Overflow(variable, int(entry["cap"]), int(entry["revision"]), float(entry["at_unix_s"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: {variable}'s entry is not an overflow record ({error})") from None


def record_overflow(path: Path, overflow: Overflow) -> None:
    """Keep ``overflow``: with one already kept, the higher cap (it blocks every cap at or below it) and the later
    time (only advice newer than both lifts it)."""
    try:
        entries = _read(path)
    except ValueError:  # unreadable: replaced by a readable one
        entries = {}
    cap, at_unix_s = overflow.cap, overflow.at_unix_s
    kept = entries.get(overflow.variable)
    if isinstance(kept, dict):
        try:
            cap, at_unix_s = max(cap, int(kept["cap"])), max(at_unix_s, float(kept["at_unix_s"]))
        except (KeyError, TypeError, ValueError):
            pass  # an unreadable entry is replaced
    entries[overflow.variable] = {"cap": cap, "revision": overflow.revision, "at_unix_s": at_unix_s}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".apply-state-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(entries, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
