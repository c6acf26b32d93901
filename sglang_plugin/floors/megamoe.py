"""DeepGEMM Mega MoE's cap's floor inputs (``SGLangLimits``), computed by capwatch (``floors/computed.py``).

SGLang 0.5.23 checks the cap at start only for Muse Spark's LayerNorm-SP Mega MoE (``layernorm_sp_hook``), not for
``--moe-a2a-backend megamoe`` in general. Its real floor is the captured graphs: ``should_use_mega_moe`` sends every
captured batch down the mega path, and ``run_mega_routed_experts`` asserts the batch fits, so a decode graph above
the cap ends the rank at capture. An eager batch above it only falls back (slower, no error).
"""

from __future__ import annotations

from capwatch.sglang_plugin.floors.computed import computed_floor
from capwatch.sizing.megamoe import MEGAMOE

_FLOOR = computed_floor(MEGAMOE)
NAME, FLOOR_RULES, cap_params, targets, limits = (
    _FLOOR.NAME, _FLOOR.FLOOR_RULES, _FLOOR.cap_params, _FLOOR.targets, _FLOOR.limits)
