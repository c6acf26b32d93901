"""One module per A2A backend: the cap's floor inputs (``SGLangLimits``) as each SGLang release has them.

A floor module provides ``NAME``, ``FLOOR_RULES`` (verified release -> "sglang": SGLang's own functions, or
"capwatch": the same rule computed by capwatch where the release has none), ``targets(release)`` (what it
calls, checked before any hook) and ``limits(server_args, sglang_version, release)``; optionally
``START_CHECKS`` (release -> SGLang's own start-up check of the cap) and ``cap_params(view)`` (the backend's
advice applies at start, ``apply/``). Not a registry: each backend's hook module names its floor module
(``hooks/<backend>.py`` ``FLOOR``), and ``hooks.FLOORS`` lists them.
"""
