"""``CAPWATCH_APPLY`` and the settings of applying advice at SGLang's start, read in the launcher (docs/apply.md).

Off by default: nothing is fetched, set or recorded. ``dry-run`` says what would be applied and why and changes
nothing; ``on`` applies advice where the operator set no value; ``override`` also replaces the operator's value.
A bad value is one line naming the variable (``SettingsError``), and nothing is applied.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from capwatch.agent.switch import switch

MODE = "CAPWATCH_APPLY"
MODES = ("off", "dry-run", "on", "override")
ADVICE_FILE = "CAPWATCH_ADVICE_FILE"
STATE_FILE = "CAPWATCH_APPLY_STATE_FILE"
LOWER_MEM_FRACTION = "CAPWATCH_APPLY_LOWER_MEM_FRACTION"
DAY_S = 86400.0

# name -> (default, low, high, unit): the ranges a value must lie in.
NUMBERS = {
    # Advice generated longer ago than this is not applied (a week: a deployment's traffic changes slower).
    "CAPWATCH_APPLY_MAX_AGE_S": (7 * DAY_S, 60.0, 90 * DAY_S, "seconds"),
    # Advice with a lower confidence (the advice's own, 0..1) is not applied; low_confidence advice never is.
    "CAPWATCH_APPLY_MIN_CONFIDENCE": (0.5, 0.0, 1.0, ""),
    # The longest the launcher waits for the service's answer before it starts with what was there.
    "CAPWATCH_APPLY_WAIT_S": (2.0, 0.1, 2.0, "seconds"),
}


class ApplySettingsError(ValueError):
    """A CAPWATCH_APPLY* / CAPWATCH_ADVICE_FILE value that cannot be used; names it, says what it takes."""


def default_state_file(environ: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/capwatch/apply-state.json`` (``~/.local/state`` without it): overflows at applied caps."""
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "capwatch" / "apply-state.json"


@dataclass(frozen=True)
class ApplySettings:
    mode: str = "off"
    advice_file: Path | None = None  # CAPWATCH_ADVICE_FILE: advice from this file, not from the service
    max_age_s: float = NUMBERS["CAPWATCH_APPLY_MAX_AGE_S"][0]
    min_confidence: float = NUMBERS["CAPWATCH_APPLY_MIN_CONFIDENCE"][0]
    wait_s: float = NUMBERS["CAPWATCH_APPLY_WAIT_S"][0]
    state_file: Path | None = None  # CAPWATCH_APPLY_STATE_FILE; None: default_state_file()
    # CAPWATCH_APPLY_LOWER_MEM_FRACTION=1: a DeepEP cap whose buffer outgrows SGLang's reserve is applied with
    # --mem-fraction-static lowered by the difference; without it such a cap is not applied.
    lower_mem_fraction: bool = False

    def state_path(self, environ: Mapping[str, str] = os.environ) -> Path:
        return self.state_file or default_state_file(environ)

    @property
    def applies(self) -> bool:
        """Whether the variable may be set (dry-run only says what it would set)."""
        return self.mode in ("on", "override")


def requested(environ: Mapping[str, str]) -> bool:
    """Whether ``CAPWATCH_APPLY`` asks for anything (a bad value does: its one line is said where it is read)."""
    return (environ.get(MODE) or "off").strip().lower() != "off"


def _number(environ: Mapping[str, str], name: str) -> float:
    default, low, high, unit = NUMBERS[name]
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApplySettingsError(f"{name}={raw[:40]!r} is not a number") from None
    if math.isnan(value) or not low <= value <= high:
        raise ApplySettingsError(f"{name}={raw[:40]!r} is outside {low:g}..{high:g}{' ' + unit if unit else ''}")
    return value


def load_apply(environ: Mapping[str, str] = os.environ) -> ApplySettings:
    """The apply settings from the environment; ApplySettingsError (one line, naming the variable) on a bad one."""
    raw_mode = environ.get(MODE)
    mode = (raw_mode or "off").strip().lower()
    if mode not in MODES:
        raise ApplySettingsError(f"{MODE}={raw_mode[:40]!r} must be one of {', '.join(MODES)}")
    advice_file = environ.get(ADVICE_FILE) or None
    if advice_file is not None and ("\n" in advice_file or "\x00" in advice_file):
        raise ApplySettingsError(f"{ADVICE_FILE} is not a file name (it holds a newline or NUL)")
    state_file = environ.get(STATE_FILE) or None
    if state_file is not None and ("\n" in state_file or "\x00" in state_file):
        raise ApplySettingsError(f"{STATE_FILE} is not a file name (it holds a newline or NUL)")
    try:
        lower = switch(environ, LOWER_MEM_FRACTION, default=False)
    except ValueError as error:
        raise ApplySettingsError(str(error)) from None
    return ApplySettings(
        mode=mode, advice_file=Path(advice_file) if advice_file else None,
        max_age_s=_number(environ, "CAPWATCH_APPLY_MAX_AGE_S"),
        min_confidence=_number(environ, "CAPWATCH_APPLY_MIN_CONFIDENCE"),
        wait_s=_number(environ, "CAPWATCH_APPLY_WAIT_S"),
        state_file=Path(state_file) if state_file else None,
        lower_mem_fraction=lower)
