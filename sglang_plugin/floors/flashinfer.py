"""The FlashInfer A2A cap's floor inputs, as each SGLang release has them (``SGLangLimits``).

0.5.22 and 0.5.23 check the cap at start-up (``arg_groups/moe_hook.py``
``validate_flashinfer_a2a_token_budget``): the plugin reads the terms with SGLang's own functions
(``_decode_graph_dispatch_tokens_per_rank``, ``max_prefill_buffer_tokens``, the resolved CUDA-graph
config), ``floor_rule="sglang"``. 0.5.19 - 0.5.21 have none of those functions and no check (only a stale
CuteDSL one, env x ep_size): capwatch computes the same rule from the functions those releases do have
(``resolved_view``, ``max_prefill_buffer_tokens``, ``max_speculative_num_draft_tokens``),
``floor_rule="capwatch"``; there eager prefill goes through an all-gather, so the advisor leaves the
prefill chunk out of the floor (``advisor/floor.py``).
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
from capwatch.sizing.flashinfer_releases import FLASHINFER as FLASHINFER_RULES

FLASHINFER = bind(FLASHINFER_RULES)  # with SGLang's variable and default for its cap

NAME = "flashinfer"
FLOOR_RULES = {"0.5.19": "capwatch", "0.5.20": "capwatch", "0.5.21": "capwatch",
               "0.5.22": "sglang", "0.5.23": "sglang"}

MOE_HOOK = "sglang.srt.arg_groups.moe_hook"
SGLANG_RULE = (Target(f"{MOE_HOOK}._decode_graph_dispatch_tokens_per_rank", ("server_args",)),
               Target(f"{MOE_HOOK}._required_flashinfer_a2a_dispatch_tokens_per_rank", ("server_args",)))


# SGLang's start-up check of this cap, a step of its resolution run for every backend once the speculative settings
# are final: CAPWATCH_APPLY sets the cap just before it (apply/launcher.py). 0.5.19 - 0.5.21 check only CuteDSL's.
START_CHECKS = {release: "validate_cutedsl_a2a_token_budget" for release in ("0.5.19", "0.5.20", "0.5.21")} | \
    {release: "validate_flashinfer_a2a_token_budget" for release in ("0.5.22", "0.5.23")}


def cap_params(view):
    """What prices this server's cap beyond the shared settings (none for FlashInfer), or why its cap is unused."""
    return None


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + (SGLANG_RULE if FLOOR_RULES[release] == "sglang" else CAPWATCH_RULE)


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """What the cap's floor needs, resolved for this server the way ``release`` does."""
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(server_args)
    rule = FLOOR_RULES[release]
    if rule == "sglang":
        decode_graph = moe_hook._decode_graph_dispatch_tokens_per_rank(server_args)
    else:
        decode_graph = decode_graph_dispatch_tokens(server_args, view)
    return sglang_limits(server_args, view, sglang_version, FLASHINFER, decode_graph, rule)

