"""One module per A2A backend: the cap's floor inputs (``SGLangLimits``) as each SGLang release has them.

A floor module provides ``FLOOR_RULES`` (verified release -> "sglang": SGLang's own functions, or
"capwatch": the same rule computed by capwatch where the release has none), ``targets(release)`` (what it
calls, checked before any hook) and ``limits(server_args, sglang_version, release)``.
"""

from __future__ import annotations

from capwatch.sglang_plugin.floors import deepep, deepep_v2, flashinfer, megamoe, mooncake, mori, nixl

FLOORS = {module.NAME: module for module in (flashinfer, deepep, deepep_v2, mooncake, mori, nixl, megamoe)}
