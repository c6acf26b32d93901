"""The FlashInfer A2A cap's floor inputs, as each SGLang release has them (``SGLangLimits``).

0.5.22 and 0.5.23 check the cap at start-up (``arg_groups/moe_hook.py``
``validate_flashinfer_a2a_token_budget``): the plugin reads the terms with SGLang's own functions
(``_decode_graph_dispatch_tokens_per_rank``, ``max_prefill_buffer_tokens``, the resolved CUDA-graph
config), ``floor_rule="sglang"``. 0.5.19 - 0.5.21 have none of those functions and no check (only a stale
CuteDSL one, env x ep_size): capwatch computes the same rule from the functions those releases do have
(``resolved_view``, ``max_prefill_buffer_tokens``, ``max_speculative_num_draft_tokens``),
``floor_rule="capwatch"``; there eager prefill goes through an all-gather, so the advisor leaves the
prefill chunk out of the floor (``service/advisor/floor.py``).
"""

from __future__ import annotations

from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.backends import FLASHINFER
from capwatch.telemetry.report import SGLangLimits

NAME = "flashinfer"
FLOOR_RULES = {"0.5.19": "capwatch", "0.5.20": "capwatch", "0.5.21": "capwatch",
               "0.5.22": "sglang", "0.5.23": "sglang"}

MOE_HOOK = "sglang.srt.arg_groups.moe_hook"
OVERRIDES = "sglang.srt.arg_groups.overrides"
COMMON = (Target(f"{OVERRIDES}.max_prefill_buffer_tokens", ("server_args",)),
          Target("sglang.srt.arg_groups.model_override_base.resolved_view", ("server_args",)),
          Target("sglang.srt.model_executor.cuda_graph_config.Backend"),
          Target("sglang.srt.environ.envs"))
SGLANG_RULE = (Target(f"{MOE_HOOK}._decode_graph_dispatch_tokens_per_rank", ("server_args",)),
               Target(f"{MOE_HOOK}._required_flashinfer_a2a_dispatch_tokens_per_rank", ("server_args",)))
CAPWATCH_RULE = (Target(f"{OVERRIDES}.max_speculative_num_draft_tokens", ("server_args",)),)


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + (SGLANG_RULE if FLOOR_RULES[release] == "sglang" else CAPWATCH_RULE)


def _prefill_graph_tokens(view) -> int:
    from sglang.srt.model_executor.cuda_graph_config import Backend

    graph = view.cuda_graph_config
    if graph is None or graph.prefill.backend == Backend.DISABLED:
        return 0
    return graph.prefill.max_bs or 0


def _decode_graph_dispatch_tokens(server_args, view) -> tuple[int, int]:
    """SGLang 0.5.22's ``_decode_graph_dispatch_tokens_per_rank``, for releases that lack it."""
    from sglang.srt.arg_groups.overrides import max_speculative_num_draft_tokens
    from sglang.srt.model_executor.cuda_graph_config import Backend

    graph = view.cuda_graph_config
    if view.disaggregation_mode == "prefill" or graph is None or graph.decode.backend == Backend.DISABLED:
        return 0, 1
    graph_bs = graph.decode.max_bs or 0
    if view.max_running_requests is not None:
        # attn_dp_size is a resolved field from 0.5.20 on; before, DP attention splits requests over dp_size.
        attn_dp_size = getattr(view, "attn_dp_size", None) or (view.dp_size if view.enable_dp_attention else 1)
        graph_bs = min(graph_bs, max(1, view.max_running_requests // attn_dp_size))
    tokens_per_request = (max_speculative_num_draft_tokens(server_args) or 1) if view.speculative_algorithm else 1
    return graph_bs, tokens_per_request


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """What the cap's floor needs, resolved for this server the way ``release`` does."""
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.arg_groups.overrides import max_prefill_buffer_tokens
    from sglang.srt.environ import envs

    view = resolved_view(server_args)
    rule = FLOOR_RULES[release]
    if rule == "sglang":
        decode_graph_bs, tokens_per_request = moe_hook._decode_graph_dispatch_tokens_per_rank(server_args)
    else:
        decode_graph_bs, tokens_per_request = _decode_graph_dispatch_tokens(server_args, view)
    configured = getattr(envs, FLASHINFER.cap_env_var).get()
    return SGLangLimits(
        sglang_version=sglang_version,
        disaggregation_mode=str(view.disaggregation_mode),
        max_prefill_buffer_tokens=max_prefill_buffer_tokens(server_args),
        prefill_cuda_graph_max_batch_size=_prefill_graph_tokens(view),
        decode_cuda_graph_max_batch_size=decode_graph_bs,
        tokens_per_request=tokens_per_request,
        cap_source="env" if configured is not None else "default",
        floor_rule=rule,
    )
