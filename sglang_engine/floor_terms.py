"""SGLang's floor terms from what a server resolved, derived once: the plugin reads the inputs from the live
server (``sglang_plugin/floors/``), the log reader from its logged arguments (``sglang_logs/server_args.py``).

The rule is 0.5.22's ``arg_groups/moe_hook.py`` ``_decode_graph_dispatch_tokens_per_rank`` and the resolved
CUDA-graph config's prefill batch; releases without those functions get the same numbers from here.
"""

from __future__ import annotations

from capwatch.sglang_engine.limits import FloorRule, SGLangLimits


def decode_graph_term(disaggregation_mode: str, graph_off: bool, graph_max_bs: int | None,
                      max_running_requests: int | None, attn_dp_size: int, speculative: bool,
                      draft_tokens: int | None) -> tuple[int, int]:
    """(requests, tokens per request) of the largest decode/verify CUDA graph on one DP rank; (0, 1) on a prefill
    server or with no decode graph. A request brings its draft tokens per step under a speculative algorithm."""
    if disaggregation_mode == "prefill" or graph_off:
        return 0, 1
    batch = max(0, graph_max_bs or 0)
    if max_running_requests is not None:
        batch = min(batch, max(1, max_running_requests // max(1, attn_dp_size)))
    return batch, (max(1, draft_tokens or 1) if speculative else 1)


def prefill_graph_term(graph_off: bool, graph_max_bs: int | None) -> int:
    """The prefill CUDA graph's largest batch in tokens; 0 with that graph off."""
    return 0 if graph_off else max(0, graph_max_bs or 0)


def floor_limits(*, sglang_version: str | None, disaggregation_mode: str, max_prefill_buffer_tokens: int,
                 prefill_graph: int, decode_graph: tuple[int, int], cap_source: str,
                 floor_rule: FloorRule, advice_revision: int | None = None) -> SGLangLimits:
    """A server's ``SGLangLimits`` from its terms (``decode_graph``: ``decode_graph_term``'s pair);
    ``cap_source``: who set the backend's cap (``limits.CAP_SOURCES``), ``advice_revision`` capwatch's."""
    decode_batch, tokens_per_request = decode_graph
    return SGLangLimits(
        sglang_version=sglang_version, disaggregation_mode=disaggregation_mode,
        max_prefill_buffer_tokens=max_prefill_buffer_tokens, prefill_cuda_graph_max_batch_size=prefill_graph,
        decode_cuda_graph_max_batch_size=decode_batch, tokens_per_request=tokens_per_request,
        cap_source=cap_source, advice_revision=advice_revision, floor_rule=floor_rule)
