"""DeepEP's low-latency cap's floor inputs, as each SGLang release has them (``SGLangLimits``).

No verified release checks ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` against its batches at start-up
(0.5.19 - 0.5.23 assert only ``<= 1024``): DeepEP's own dispatch assertion (each rank's local batch <= the cap)
ends the rank at run time, at CUDA-graph capture for the largest decode batch. So capwatch computes the terms
in every release (``floor_rule="capwatch"``) from the functions all of them have (``floors/graph_terms.py``):
the decode/verify CUDA-graph batch x tokens per request, the prefill CUDA-graph batch and the prefill chunk.
Which of them reach the low-latency buffer depends on ``--deepep-mode`` (auto sends prefill to normal mode):
the advisor decides that from the rank's reported mode (``advisor/floor.py``).
"""

from __future__ import annotations

from capwatch.sglang_plugin.floors.graph_terms import (
    CAPWATCH_RULE,
    COMMON,
    decode_graph_dispatch_tokens,
    sglang_limits,
)
from capwatch.sglang_plugin.floors.graph_terms import ArgsReader
from capwatch.sglang_plugin.releases import VERIFIED, Target
from capwatch.sizing.checks import SizingError
from capwatch.sizing.deepep_plan import (
    DEEPEP,
    DEEPEP_MODES,
    DeepEPPricing,
    plan_deepep_buffer,
    prefill_dispatched,
)
from capwatch.sizing.model_presets import ModelGeometry
from capwatch.telemetry.report import SGLangLimits

NAME = DEEPEP.name
FLOOR_RULES = {release: "capwatch" for release in VERIFIED}


def targets(release: str) -> tuple[Target, ...]:
    return COMMON + CAPWATCH_RULE


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """What the cap's floor needs, resolved for this server the way ``release`` does."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(server_args)
    return sglang_limits(server_args, view, sglang_version, DEEPEP, decode_graph_dispatch_tokens(server_args, view),
                         FLOOR_RULES[release])


def server_params(args: ArgsReader) -> tuple[tuple[str, object], ...]:
    """DeepEP's buffer beyond the model: --deepep-mode, --ep-num-redundant-experts, and the fused shared expert
    slots of --enforce-shared-experts-fusion (DeepEP servers fuse only on request)."""
    return (("deepep_mode", args.text("deepep_mode")),
            ("redundant_experts", max(0, args.integer("ep_num_redundant_experts", 0, limit=1 << 16) or 0)),
            ("shared_experts_fusion",
             args.flag("enforce_shared_experts_fusion") and not args.flag("disable_shared_experts_fusion")))


def server_pricing(params: dict, geometry: ModelGeometry, ep_size: int, alignment: int) -> tuple[DeepEPPricing, bool]:
    """The buffer SGLang's DeepEP dispatcher allocates per cap, and whether prefill goes through it (low_latency
    mode); SizingError where the server has no capped buffer or it cannot be sized."""
    mode = params.get("deepep_mode") or DEEPEP_MODES[0]
    if mode not in DEEPEP_MODES:
        raise SizingError(f"the server runs --deepep-mode {mode}: it has no low-latency buffer and no per-rank token "
                          "cap; no advice")
    try:  # one cap prices the rest: the normal-mode bytes and the experts do not depend on it
        plan = plan_deepep_buffer(geometry, ep_size, alignment, mode, params.get("redundant_experts", 0),
                                  geometry.shared_experts if params.get("shared_experts_fusion") else 0)
    except SizingError as error:
        raise SizingError(f"DeepEP's buffer for this server cannot be sized: {error}") from None
    return DeepEPPricing(ep_size, geometry.hidden_size, plan.buffer_experts, plan.normal_nvl_bytes,
                         plan.normal_rdma_bytes), prefill_dispatched(mode)
