"""SGLang's own start-up floor inputs, read through SGLang's functions (``arg_groups/moe_hook.py``)."""

from __future__ import annotations

from capwatch.sizing.backends import FLASHINFER
from capwatch.telemetry.report import SGLangLimits


def sglang_limits(server_args, sglang_version: str | None) -> SGLangLimits:
    """What ``validate_flashinfer_a2a_token_budget`` reads, resolved by SGLang for this server."""
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend

    view = moe_hook.resolved_view(server_args)
    graph = view.cuda_graph_config
    prefill_graph_bs = 0
    if graph is not None and graph.prefill.backend != Backend.DISABLED:
        prefill_graph_bs = graph.prefill.max_bs or 0
    decode_graph_bs, tokens_per_request = moe_hook._decode_graph_dispatch_tokens_per_rank(server_args)
    configured = getattr(envs, FLASHINFER.cap_env_var).get()
    return SGLangLimits(
        sglang_version=sglang_version,
        disaggregation_mode=str(view.disaggregation_mode),
        max_prefill_buffer_tokens=moe_hook.max_prefill_buffer_tokens(server_args),
        prefill_cuda_graph_max_batch_size=prefill_graph_bs,
        decode_cuda_graph_max_batch_size=decode_graph_bs,
        tokens_per_request=tokens_per_request,
        cap_source="env" if configured is not None else "default",
    )
