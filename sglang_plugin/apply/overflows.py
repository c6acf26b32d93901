"""In a scheduler: an overflow at a cap the launcher applied is recorded in the apply state file (``state.py``), so
no later start applies that cap or a lower one until newer advice. Attached to each counted layer by the backend
session (``RankSession.layer_watchers``); nothing where the cap was not applied by capwatch."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

from capwatch.sglang_plugin.apply import state
from capwatch.sglang_plugin.apply.applied import read_applied
from capwatch.sglang_plugin.apply.settings import ApplySettingsError, default_state_file, load_apply

logger = logging.getLogger("capwatch.sglang")


def recorder(variable: str, environ: Mapping[str, str] = os.environ) -> Callable[[object], None] | None:
    """The ``on_overflow`` callback for a dispatcher built with ``variable``'s applied cap, or None."""
    applied = read_applied(variable, environ)
    if applied is None or applied.source != "capwatch" or environ.get(variable) != str(applied.cap):
        return None
    try:
        path = load_apply(environ).state_path(environ)
    except ApplySettingsError:
        path = default_state_file(environ)
    recorded = []

    def on_overflow(event) -> None:
        if recorded:  # once a process: the rank ends at its first overflow on most backends
            return
        recorded.append(True)
        try:
            state.record_overflow(path, state.Overflow(variable, applied.cap, applied.revision, time.time()))
        except OSError as error:
            logger.error("capwatch: apply: the overflow at the applied %s=%d could not be recorded in %s (%s)",
                         variable, applied.cap, path, error)
            return
        logger.error("capwatch: apply: overflow at the applied %s=%d (advice revision %d), recorded in %s: no later "
                     "start applies %d or less until advice newer than this overflow", variable, applied.cap,
                     applied.revision, path, applied.cap)

    return on_overflow


def watch(counting) -> None:
    """Attach the recorder to one counted layer (``LayerCounting``) where its cap (``counting.rules``' variable) was
    applied: a ``RankSession.layer_watchers`` entry (``plugin.py``)."""
    callback = recorder(counting.rules.cap_env_var)
    if callback is not None:
        counting.on_overflow.append(callback)
