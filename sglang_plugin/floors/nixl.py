"""NIXL EP's cap's floor inputs (``SGLangLimits``), computed by capwatch.

SGLang 0.5.23 checks nothing of ``SGLANG_NIXL_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` at start-up (it asserts
only ``<= 1024``); NIXL EP's dispatch assertion (each rank's own batch <= the cap) ends the rank at run time,
at CUDA-graph capture for the largest decode batch. capwatch computes the terms (``floor_rule="capwatch"``) from
the functions the release has (``floors/graph_terms.py``): the decode/verify CUDA-graph batch x tokens per
request, the prefill CUDA-graph batch and the prefill chunk (low-latency mode only: prefill meets the cap too).
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
from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.nixl import NIXL as NIXL_RULES

NIXL = bind(NIXL_RULES)  # with SGLang's variable and default for its cap

NAME = NIXL.name
FLOOR_RULES = {"0.5.23": "capwatch"}


def cap_params(view):
    """What prices this server's cap beyond the shared settings: nothing the floor needs (the buffer's bytes come
    from a rank's report)."""
    return None


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + CAPWATCH_RULE


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """What the cap's floor needs, resolved for this server."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(server_args)
    return sglang_limits(server_args, view, sglang_version, NIXL, decode_graph_dispatch_tokens(server_args, view),
                         FLOOR_RULES.get(release, "capwatch"))
