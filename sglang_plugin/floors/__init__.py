"""One module per A2A backend: the cap's floor inputs (``SGLangLimits``) as each SGLang release has them.

A floor module provides ``FLOOR_RULES`` (verified release -> "sglang": SGLang's own functions, or
"capwatch": the same rule computed by capwatch where the release has none), ``targets(release)`` (what it
calls, checked before any hook) and ``limits(server_args, sglang_version, release)``; and, for the log reader,
what a server's logged args say of the backend: ``server_params(args)`` (the args that size it, hashable) and
``server_pricing(params, geometry, ep_size, alignment)`` (its pricing, and whether prefill meets its cap;
``SizingError`` saying why not).
"""

from __future__ import annotations

from capwatch.sglang_plugin.floors import deepep, flashinfer

FLOORS = {module.NAME: module for module in (flashinfer, deepep)}
