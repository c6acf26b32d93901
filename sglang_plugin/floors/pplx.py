"""pplx's cap's floor inputs (``SGLangLimits``), from SGLang's own start-up rule.

0.5.23 refuses to start below it (``arg_groups/moe_hook.py`` ``_handle_a2a_moe``): on a server with chunked
prefill that is not a decode server, ``required_pplx_dispatch_tokens_per_rank`` (the chunked-prefill size, or the
decode CUDA-graph batch ``cuda_graph_max_bs_decode`` when larger) <= the cap. The plugin reads it with SGLang's own
function (``floor_rule="sglang"``) as the limits' prefill term, and the decode CUDA-graph batch x tokens per
request with SGLang's ``_decode_graph_dispatch_tokens_per_rank``: every batch goes through pplx's cap (low-latency
mode only), so a captured decode graph above it fails at capture even where SGLang checks nothing (a decode
server, chunked prefill off: there the prefill term is the server's prefill buffer, as for every backend).
"""

from __future__ import annotations

from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.floors.graph_terms import COMMON, sglang_limits
from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.pplx import PPLX as PPLX_RULES

PPLX = bind(PPLX_RULES)  # with SGLang's variable and default for its cap

NAME = PPLX.name
FLOOR_RULES = {"0.5.23": "sglang"}  # the plugin's hooks are verified on 0.5.23 (hooks/pplx.py)

MOE_HOOK = "sglang.srt.arg_groups.moe_hook"
SGLANG_RULE = (Target(f"{MOE_HOOK}.required_pplx_dispatch_tokens_per_rank", ("server_args",)),
               Target(f"{MOE_HOOK}._decode_graph_dispatch_tokens_per_rank", ("server_args",)))


def cap_params(view):
    """Nothing the floor needs beyond the shared settings (the AllToAll's arguments come from a rank's report)."""
    return None


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + SGLANG_RULE


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """SGLang's terms for this server: its pplx dispatch tokens per rank (where it checks them) and its decode
    graph."""
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view

    if release not in FLOOR_RULES:
        raise ValueError(f"sglang {release}'s pplx floor is not verified ({', '.join(FLOOR_RULES)} is)")
    view = resolved_view(server_args)
    found = sglang_limits(server_args, view, sglang_version, PPLX,
                          moe_hook._decode_graph_dispatch_tokens_per_rank(server_args), FLOOR_RULES[release])
    if (view.chunked_prefill_size or 0) > 0 and str(view.disaggregation_mode) != "decode":  # SGLang's own check
        return found.model_copy(update={
            "max_prefill_buffer_tokens": moe_hook.required_pplx_dispatch_tokens_per_rank(server_args)})
    return found
