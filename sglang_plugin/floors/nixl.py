"""NIXL EP's cap's floor inputs (``SGLangLimits``), computed by capwatch: SGLang checks nothing of it at start-up
(``floors/computed.py``)."""

from __future__ import annotations

from capwatch.sglang_plugin.floors.computed import computed_floor
from capwatch.sglang_plugin.releases import VERIFIED
from capwatch.sizing.nixl import NIXL

_FLOOR = computed_floor(NIXL, VERIFIED)  # its terms' functions are in every verified release
NAME, FLOOR_RULES, cap_params, targets, limits = (
    _FLOOR.NAME, _FLOOR.FLOOR_RULES, _FLOOR.cap_params, _FLOOR.targets, _FLOOR.limits)
