"""capwatch inside SGLang 0.5.19 - 0.5.23: an ``sglang.srt.plugins`` entry point that instruments the MoE
all-to-all dispatchers of a scheduler process (one hook and one floor module per backend, ``hooks/``,
``floors/``, registered once in ``hooks/__init__.py``), with no change to SGLang; SGLang's own facts (its limits, floor, cap variables) are
``sglang_engine/``'s, the engine-neutral rank agent is ``agent/``.

SGLang loads every installed plugin while ``SGLANG_PLUGINS`` is empty (its default): installing the package
enables the plugin. ``CAPWATCH_ENABLED=0`` switches it off (``agent/switch.py``: nothing imported, hooked or
bound); ``SGLANG_PLUGINS=<others>`` leaves it out. Configured by ``CAPWATCH_*`` variables (``settings.py``, over
the rank agent's ``agent/settings.py``).
``register`` runs in every SGLang process that loads plugins; it only hooks ``configure_scheduler_process``
(``plugin.py``), and the rest happens in scheduler processes: ``releases.py`` picks the installed release's
adapters, the rank agent's session (``agent/session.py``) keeps one scheduler's counters, exporter and reports,
``status.py`` names the series that says whether it instruments; ``start_check.py`` and ``cap_origin.py`` say
at start whether the cap holds the floor and who set it; ``apply/`` applies the advice at start
(``CAPWATCH_APPLY``). See docs/sglang.md.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

from capwatch.agent import switch
from capwatch.sglang_plugin.releases import SCHEDULER_MODULE

logger = logging.getLogger("capwatch.sglang")

# What the plugin imports beyond SGLang's own environment: the ``sglang`` extra (and the server's torch).
NEEDS = ("torch", "prometheus_client", "pydantic")


def register() -> None:
    """The entry point SGLang's ``load_plugins()`` calls: off, or without its extra, it does nothing but say so
    (once, in scheduler processes) and SGLang runs as shipped."""
    on, line = switch.enabled(os.environ, "SGLang")
    if on:
        missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
        if missing:
            on, line = False, (f"capwatch: disabled: {', '.join(missing)} not installed in this environment "
                               "(pip install 'a2a-capwatch[sglang]' into the server's); SGLang runs without capwatch")
    if not on:
        if SCHEDULER_MODULE in sys.modules:  # one line per scheduler, as every other state of the plugin
            (logger.info if line.startswith("capwatch: off") else logger.warning)(line)
        return
    from capwatch.sglang_plugin.apply.settings import requested

    if requested(os.environ):  # CAPWATCH_APPLY: wraps the launcher's resolution (apply/launcher.py)
        from capwatch.sglang_plugin.apply.launcher import install as install_apply

        install_apply()
    from capwatch.sglang_plugin.plugin import install

    install()
