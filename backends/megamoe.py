"""DeepGEMM Mega MoE as a backend (``--moe-a2a-backend megamoe``): its rules (``sizing/megamoe.py``), its symmetric
buffer's bytes as a rank reports them (``backends/reported.py``), and its own counter: the steps that fell back to
the non-mega path because R exceeded the cap."""

from __future__ import annotations

from dataclasses import replace

from capwatch.backends.reported import reported_spec
from capwatch.backends.spec import CounterSeries
from capwatch.engines import ENGINE
from capwatch.sizing.megamoe import MAX_RANKS, MEGAMOE, check_hidden_size

RULES = ENGINE.bind_rules(MEGAMOE)  # with the engine's variable and default for the cap
FALLBACK_STEPS = CounterSeries(
    "fallback_steps", f"Forward steps this rank ran on the slower non-mega MoE path because R exceeded the cap "
    f"({RULES.cap_env_var}): no error and no log line; raising the cap stops them at the price of a larger "
    "symmetric buffer.", "steps")
_SPEC = reported_spec(RULES, check_hidden_size=check_hidden_size, description=f"""\
--backend megamoe prices {RULES.cap_env_var} (default {RULES.default_cap}) in DeepGEMM's Mega MoE symmetric
buffer. Its size is DeepGEMM's compiled get_symm_buffer_size_for_mega_moe, whose ring buffers follow the GPU's SM
count, so capwatch cannot compute it offline: give the bytes a rank reported at its cap; other caps are priced in
proportion, an estimate. An eager step above the cap is not refused: it falls back to the slower non-mega path.""")
SPEC = replace(_SPEC, series=replace(_SPEC.series, counters=(FALLBACK_STEPS,)), max_ep_size=MAX_RANKS)
