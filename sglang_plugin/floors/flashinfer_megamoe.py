"""FlashInfer MegaMoE's cap's floor inputs (``SGLangLimits``), computed by capwatch: SGLang checks nothing of it at
start-up (``floors/computed.py``: the prefill chunk, the prefill CUDA-graph batch and the decode/verify CUDA-graph
batch x tokens per request, every one of which reaches the layer as a rank's own batch).

Its variable's 0 (the default) means SGLang derives the cap when it builds each layer
(``_resolve_max_tokens_per_rank``: ``cutedsl_moe_max_num_tokens()``, from the same kinds of terms: the prefill
tokens rather than the smaller chunk, the prefill CUDA-graph batch only when piecewise, the decode graph without the
running-requests bound), so a derived cap normally meets these terms; the start-up check compares them with the cap
SGLang resolves (``hooks/flashinfer_megamoe.py`` ``cap_at_start``), never with the 0. A 0 the operator exported is
that same default, reported as SGLang's, not as a number the operator chose.
"""

from __future__ import annotations

import os

from capwatch.sglang_plugin.floors.computed import computed_floor
from capwatch.sizing.flashinfer_megamoe import FLASHINFER_MEGAMOE

_FLOOR = computed_floor(FLASHINFER_MEGAMOE, ("0.5.22", "0.5.23"))
NAME, FLOOR_RULES, cap_params, targets = _FLOOR.NAME, _FLOOR.FLOOR_RULES, _FLOOR.cap_params, _FLOOR.targets


def limits(server_args, sglang_version: str | None, release: str):
    """The computed terms; the cap's source is SGLang's default where the variable says 0 (derived)."""
    found = _FLOOR.limits(server_args, sglang_version, release)
    if found.cap_source == "operator" and os.environ.get(_FLOOR.rules.cap_env_var, "").strip() == "0":
        return found.model_copy(update={"cap_source": "default"})
    return found
