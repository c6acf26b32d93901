"""Who set the cap a scheduler's dispatcher is built with: capwatch at start (and the advice revision), the operator,
or SGLang's default — the launcher's record (``apply/applied.py``) checked against the variable the dispatcher reads.

The launcher records what it resolved; a scheduler reports capwatch as the source only while the variable still
holds the cap capwatch applied (anyone who changed it since is the operator), so the report says what the dispatcher
was built with, not what the launcher meant.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from capwatch.sglang_engine.limits import MAX_ADVICE_REVISION
from capwatch.sglang_plugin.apply.applied import read_applied

logger = logging.getLogger("capwatch.sglang")


def cap_origin(cap_variable: str, environ: Mapping[str, str] = os.environ) -> tuple[str, int | None]:
    """``(cap_source, advice_revision)`` of ``cap_variable`` in this process: ``SGLangLimits``' two fields."""
    raw = environ.get(cap_variable)
    unapplied = ("operator" if raw is not None else "default"), None
    applied = read_applied(cap_variable, environ)
    if applied is None or applied.source != "capwatch":
        return unapplied
    if _integer(raw) != applied.cap:
        logger.warning("capwatch: %s is %s, not the %d capwatch applied at start (revision %s): reported as %s",
                       cap_variable, "unset" if raw is None else repr(raw), applied.cap, applied.revision,
                       "set by the operator" if raw is not None else "SGLang's default")
        return unapplied
    revision = applied.revision if applied.revision is not None and applied.revision <= MAX_ADVICE_REVISION else None
    return "capwatch", revision


def _integer(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None
