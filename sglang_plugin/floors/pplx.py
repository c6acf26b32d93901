"""pplx's cap's floor inputs (``SGLangLimits``), from SGLang's own start-up rule.

Every verified release (0.5.19 – 0.5.23, the same code) refuses to start below it (``arg_groups/moe_hook.py``
``_handle_a2a_moe``): on a server with chunked prefill that is not a decode server,
``required_pplx_dispatch_tokens_per_rank`` (the chunked-prefill size, or the decode CUDA-graph batch
``cuda_graph_max_bs_decode`` when larger) <= the cap. The plugin reads it with SGLang's own function as the
limits' prefill term (``floor_rule="sglang"``; ``"capwatch"`` where SGLang checks nothing), and the decode
CUDA-graph batch x tokens per request with SGLang's ``_decode_graph_dispatch_tokens_per_rank`` (0.5.22 on;
before, capwatch's transcription of it: ``graph_terms.decode_graph_dispatch_tokens``): every batch goes through
pplx's cap (low-latency mode only), so a captured decode graph above it fails at capture even where SGLang checks
nothing (a decode server, chunked prefill off: there the prefill term is the server's prefill buffer, as for
every backend).
"""

from __future__ import annotations

from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.floors.graph_terms import COMMON, decode_graph_dispatch_tokens, sglang_limits
from capwatch.sglang_plugin.releases import VERIFIED, Target
from capwatch.sizing.pplx import PPLX as PPLX_RULES

PPLX = bind(PPLX_RULES)  # with SGLang's variable and default for its cap

NAME = PPLX.name
FLOOR_RULES = {release: "sglang" for release in VERIFIED}  # SGLang checks the same rule in each (hooks/pplx.py)
DECODE_GRAPH_FUNCTION_SINCE = "0.5.22"  # SGLang's _decode_graph_dispatch_tokens_per_rank: capwatch's before

MOE_HOOK = "sglang.srt.arg_groups.moe_hook"
SGLANG_RULE = Target(f"{MOE_HOOK}.required_pplx_dispatch_tokens_per_rank", ("server_args",))
SGLANG_DECODE_GRAPH = Target(f"{MOE_HOOK}._decode_graph_dispatch_tokens_per_rank", ("server_args",))


def cap_params(view):
    """Nothing the floor needs beyond the shared settings (the AllToAll's arguments come from a rank's report)."""
    return None


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + (SGLANG_RULE,) + ((SGLANG_DECODE_GRAPH,) if _has_decode_graph_function(release) else ())


def _has_decode_graph_function(release: str) -> bool:
    return VERIFIED.index(release) >= VERIFIED.index(DECODE_GRAPH_FUNCTION_SINCE)


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """SGLang's terms for this server: its pplx dispatch tokens per rank (where it checks them) and its decode
    graph."""
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view

    if release not in FLOOR_RULES:
        raise ValueError(f"sglang {release}'s pplx floor is not verified ({', '.join(FLOOR_RULES)} is)")
    view = resolved_view(server_args)
    decode_graph = (moe_hook._decode_graph_dispatch_tokens_per_rank(server_args) if _has_decode_graph_function(release)
                    else decode_graph_dispatch_tokens(server_args, view))
    if (view.chunked_prefill_size or 0) > 0 and str(view.disaggregation_mode) != "decode":  # SGLang's own check
        found = sglang_limits(server_args, view, sglang_version, PPLX, decode_graph, FLOOR_RULES[release])
        return found.model_copy(update={
            "max_prefill_buffer_tokens": moe_hook.required_pplx_dispatch_tokens_per_rank(server_args)})
    return sglang_limits(server_args, view, sglang_version, PPLX, decode_graph, "capwatch")  # SGLang checks nothing
