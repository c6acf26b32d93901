"""capwatch inside SGLang 0.5.19 - 0.5.23: an ``sglang.srt.plugins`` entry point that instruments every
``FlashinferDispatcher`` of a scheduler process, with no change to SGLang.

Enabled with ``SGLANG_PLUGINS=capwatch`` (or by SGLang loading every installed plugin), configured by
``CAPWATCH_*`` variables (``settings.py``). ``register`` runs in every SGLang process that loads
plugins; it only hooks ``configure_scheduler_process``, and the rest happens in scheduler processes:
``releases.py`` picks the installed release's adapters (``hooks/``, ``floors/``). See docs/sglang.md.
"""

from __future__ import annotations


def register() -> None:
    """The entry point SGLang's ``load_plugins()`` calls."""
    from capwatch.sglang_plugin.plugin import install

    install()
