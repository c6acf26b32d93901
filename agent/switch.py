"""A plugin's kill switch, ``CAPWATCH_ENABLED``, and the on/off rule every ``CAPWATCH_*`` switch follows.

Read by an engine plugin's entry point before anything else of capwatch's is imported: switched off, the plugin
imports nothing, hooks nothing and binds no port, so the engine runs exactly as shipped even where it loads every
installed plugin (SGLang's default). Standard library only: the entry point must load where the plugin's extra
is missing.
"""

from __future__ import annotations

from collections.abc import Mapping

ENABLED = "CAPWATCH_ENABLED"
ON = ("1", "true")
OFF = ("0", "false")


def switch(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """A ``1``/``0`` variable (or true/false; unset or empty: ``default``); raises
    ``ValueError`` naming it for anything else."""
    raw = environ.get(name)
    value = (raw or "").strip().lower()
    if not value:
        return default
    if value not in ON + OFF:
        raise ValueError(f"{name}={raw[:40]!r} must be 1 or 0")
    return value in ON


def enabled(environ: Mapping[str, str], engine: str) -> tuple[bool, str | None]:
    """Whether the plugin may start, and the line to log where it may not (``engine``: the engine's name in it).
    A value the switch cannot read keeps the plugin off: an operator who typed one meant to say something, and
    off changes nothing."""
    try:
        on = switch(environ, ENABLED, default=True)
    except ValueError as error:
        return False, f"capwatch: disabled: {error}; {engine} runs without capwatch"
    if on:
        return True, None
    return False, (f"capwatch: off ({ENABLED}={environ[ENABLED].strip()}): nothing hooked, no port bound; "
                   f"{engine} runs as shipped")
