"""MoRI's cap's floor inputs, as each SGLang release has them (``SGLangLimits``).

SGLang 0.5.19 - 0.5.23 check one term at start-up (``arg_groups/moe_hook.py``, ``handle_a2a_moe``): on a server
that is not a decode server, ``required_mori_dispatch_tokens_per_rank`` (the chunked-prefill size) <= the cap.
Nothing checks the decode side (sglang#37964), and below it MoRI corrupts memory silently (ROCm/mori#356). So
capwatch computes the whole rule in every release (``floor_rule="capwatch"``) from the functions all of them have
(``floors/graph_terms.py``): the prefill chunk (SGLang's own term), the prefill CUDA-graph batch and the
decode/verify CUDA-graph batch x tokens per request (the terms SGLang lacks). Every batch goes through MoRI's cap,
prefill included, in normal and low-latency mode alike (``rules.eager_prefill_dispatched``).
"""

from __future__ import annotations

from capwatch.sglang_plugin.floors.graph_terms import (
    CAPWATCH_RULE,
    COMMON,
    decode_graph_dispatch_tokens,
    sglang_limits,
)
from capwatch.sglang_plugin.releases import VERIFIED, Target
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sizing.mori import MORI as MORI_RULES

MORI = bind(MORI_RULES)  # with SGLang's variable and default for its cap

NAME = MORI.name
FLOOR_RULES = {release: "capwatch" for release in VERIFIED}


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + CAPWATCH_RULE


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """What the cap's floor needs, resolved for this server the way ``release`` does."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(server_args)
    return sglang_limits(server_args, view, sglang_version, MORI, decode_graph_dispatch_tokens(server_args, view),
                         FLOOR_RULES[release])
