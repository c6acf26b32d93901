"""SGLang's floor terms computed by capwatch from the functions every verified release has (``resolved_view``,
``max_speculative_num_draft_tokens``, the resolved CUDA-graph config): what reaches a backend's dispatch from a
captured graph (the rule itself: ``sglang_engine/floor_terms.py``). Floor modules of releases or backends without
SGLang's own rule use them."""

from __future__ import annotations

from capwatch.sglang_engine.floor_terms import decode_graph_term, floor_limits, prefill_graph_term
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.cap_origin import cap_origin
from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.backends import BackendCapRules

OVERRIDES = "sglang.srt.arg_groups.overrides"
COMMON = (Target(f"{OVERRIDES}.max_prefill_buffer_tokens", ("server_args",)),
          Target("sglang.srt.arg_groups.model_override_base.resolved_view", ("server_args",)),
          Target("sglang.srt.model_executor.cuda_graph_config.Backend"),
          Target("sglang.srt.environ.envs"))
CAPWATCH_RULE = (Target(f"{OVERRIDES}.max_speculative_num_draft_tokens", ("server_args",)),)

def prefill_graph_tokens(view) -> int:
    from sglang.srt.model_executor.cuda_graph_config import Backend

    graph = view.cuda_graph_config
    return prefill_graph_term(graph is None or graph.prefill.backend == Backend.DISABLED,
                              None if graph is None else graph.prefill.max_bs)


def decode_graph_dispatch_tokens(server_args, view) -> tuple[int, int]:
    """SGLang 0.5.22's ``_decode_graph_dispatch_tokens_per_rank``, for releases that lack it."""
    from sglang.srt.arg_groups.overrides import max_speculative_num_draft_tokens
    from sglang.srt.model_executor.cuda_graph_config import Backend

    graph = view.cuda_graph_config
    attn_dp_size = 1
    if view.max_running_requests is not None:
        # attn_dp_size is a resolved field from 0.5.20 on; before, DP attention splits requests over dp_size.
        attn_dp_size = getattr(view, "attn_dp_size", None) or (view.dp_size if view.enable_dp_attention else 1)
    speculative = bool(view.speculative_algorithm)
    return decode_graph_term(
        str(view.disaggregation_mode), graph is None or graph.decode.backend == Backend.DISABLED,
        None if graph is None else graph.decode.max_bs, view.max_running_requests, attn_dp_size, speculative,
        max_speculative_num_draft_tokens(server_args) if speculative else None)


def sglang_limits(server_args, view, sglang_version: str | None, rules: BackendCapRules,
                  decode_graph: tuple[int, int], floor_rule: str) -> SGLangLimits:
    """The floor inputs of a server (its resolved ``view``), the decode graph term (batch, tokens per request) as
    the floor module computed it, and who set the backend's cap (``cap_origin``)."""
    from sglang.srt.arg_groups.overrides import max_prefill_buffer_tokens

    cap_source, advice_revision = cap_origin(rules.cap_env_var)
    return floor_limits(
        sglang_version=sglang_version, disaggregation_mode=str(view.disaggregation_mode),
        max_prefill_buffer_tokens=max_prefill_buffer_tokens(server_args), prefill_graph=prefill_graph_tokens(view),
        decode_graph=decode_graph, cap_source=cap_source, advice_revision=advice_revision, floor_rule=floor_rule)
