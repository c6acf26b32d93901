"""DeepEP v2's cap's floor inputs (``SGLangLimits``), from SGLang's own start-up rule.

0.5.23 refuses to start below it (``arg_groups/moe_hook.py`` ``validate_deepep_v2_dispatch_token_budget``): the
per-rank prefill budget (``required_deepep_v2_prefill_tokens_per_rank``: the prefill buffer scattered over
``tp_size // attn_dp_size`` ranks, after the model's own sharding; not on a decode server) and the decode
CUDA-graph batch x tokens per request (``_decode_graph_dispatch_tokens_per_rank``). The plugin reads both with
SGLang's functions (``floor_rule="sglang"``); the prefill term rides as the limits' prefill buffer.
"""

from __future__ import annotations

from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.floors.graph_terms import COMMON, sglang_limits
from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.deepep_v2 import DEEPEP_V2 as DEEPEP_V2_RULES

DEEPEP_V2 = bind(DEEPEP_V2_RULES)  # with SGLang's variable and default for its cap

NAME = DEEPEP_V2.name
# 0.5.22 and 0.5.23 have the three functions (0.5.19 - 0.5.21 lack the per-rank prefill budget); the plugin's
# hooks are verified on 0.5.23 (hooks/deepep_v2.py).
FLOOR_RULES = {"0.5.22": "sglang", "0.5.23": "sglang"}

MOE_HOOK = "sglang.srt.arg_groups.moe_hook"
SGLANG_RULE = (Target(f"{MOE_HOOK}.validate_deepep_v2_dispatch_token_budget", ("server_args",)),
               Target(f"{MOE_HOOK}.required_deepep_v2_prefill_tokens_per_rank", ("server_args",)),
               Target(f"{MOE_HOOK}._decode_graph_dispatch_tokens_per_rank", ("server_args",)))


def cap_params(view):
    """What prices this server's cap beyond the shared settings: nothing the floor needs (the buffer's bytes come
    from a rank's report)."""
    return None


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + SGLANG_RULE


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """SGLang's terms for this server: its prefill budget per rank and its decode graph."""
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view

    if release not in FLOOR_RULES:
        raise ValueError(f"sglang {release} has no per-rank DeepEP v2 prefill budget ({', '.join(FLOOR_RULES)} do)")
    view = resolved_view(server_args)
    found = sglang_limits(server_args, view, sglang_version, DEEPEP_V2,
                          moe_hook._decode_graph_dispatch_tokens_per_rank(server_args), FLOOR_RULES[release])
    prefill = (0 if view.disaggregation_mode == "decode"
               else moe_hook.required_deepep_v2_prefill_tokens_per_rank(server_args))
    return found.model_copy(update={"max_prefill_buffer_tokens": prefill})
