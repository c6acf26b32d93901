"""DeepEP's low-latency cap's floor inputs, as each SGLang release has them (``SGLangLimits``).

No verified release checks ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` against its batches at start-up
(0.5.19 - 0.5.23 assert only ``<= 1024``): DeepEP's own dispatch assertion (each rank's local batch <= the cap)
ends the rank at run time, at CUDA-graph capture for the largest decode batch. So capwatch computes the terms
in every release (``floor_rule="capwatch"``) from the functions all of them have (``floors/graph_terms.py``):
the decode/verify CUDA-graph batch x tokens per request, the prefill CUDA-graph batch and the prefill chunk.
Which of them reach the low-latency buffer depends on ``--deepep-mode`` (auto sends prefill to normal mode):
the advisor decides that from the rank's reported mode (``advisor/floor.py``).
"""

from __future__ import annotations

from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.floors.graph_terms import (
    CAPWATCH_RULE,
    COMMON,
    decode_graph_dispatch_tokens,
    sglang_limits,
)
from capwatch.sglang_plugin.releases import VERIFIED, Target
from capwatch.sizing.deepep_plan import DEEPEP as DEEPEP_RULES

DEEPEP = bind(DEEPEP_RULES)  # with SGLang's variable and default for its cap

NAME = DEEPEP.name
FLOOR_RULES = {release: "capwatch" for release in VERIFIED}


def cap_params(view):
    """The low-latency buffer's parameters the floor needs (its mode), or why this server's cap is unused."""
    from capwatch.backends.deepep import DeepEPBuffer

    mode = str(getattr(view.deepep_mode, "value", view.deepep_mode))
    if mode == "normal":
        return "--deepep-mode normal builds no low-latency buffer: its cap is not used"
    return DeepEPBuffer.model_construct(mode=mode)


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + CAPWATCH_RULE


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """What the cap's floor needs, resolved for this server the way ``release`` does."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(server_args)
    return sglang_limits(server_args, view, sglang_version, DEEPEP, decode_graph_dispatch_tokens(server_args, view),
                         FLOOR_RULES[release])

