"""DeepGEMM Mega MoE's cap's floor inputs (``SGLangLimits``): SGLang's own rule where it has one, else computed.

SGLang 0.5.23 checks the cap at start (``arg_groups/mega_moe_hook.py`` ``validate_mega_moe_token_budget_for_model``)
only for its models whose MoE blocks have no fallback (``mega_moe_needs_token_budget``: ``MEGA_MOE_NO_FALLBACK_ARCHS``,
Qwen2/3 MoE, DeepSeek V4, ...; NVFP4 experts): the decode/verify graph bucket x tokens per request, and off a decode
server each rank's effective prefill budget. There ``floor_rule="sglang"`` and the prefill term is that budget
(``required_prefill_tokens_per_rank``: SGLang computes it inline, so transcribed here). Elsewhere (DeepSeek V2/V3,
whose MoE falls back) nothing checks it and capwatch computes the floor (``floors/computed.py``): the captured graphs
take the mega path whatever their size and ``run_mega_routed_experts`` asserts the batch fits, so a graph above the
cap ends the rank at capture; an eager batch above it only falls back (slower, no error).
"""

from __future__ import annotations

from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.floors.computed import computed_floor
from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.megamoe import MEGAMOE

_FLOOR = computed_floor(MEGAMOE)
NAME, FLOOR_RULES, cap_params = _FLOOR.NAME, _FLOOR.FLOOR_RULES, _FLOOR.cap_params
MEGA_MOE_HOOK = "sglang.srt.arg_groups.mega_moe_hook"
SGLANG_RULE = (Target(f"{MEGA_MOE_HOOK}.mega_moe_needs_token_budget", ("model_arch", "hf_quant_config", "quantization")),
               Target(f"{MEGA_MOE_HOOK}.validate_mega_moe_token_budget", ("server_args", "model_label")),
               Target("sglang.srt.arg_groups.overrides.model_config_of", ("server_args",)),
               Target("sglang.srt.runtime_context.attn_dp_enabled_of", ("cfg",)))


def targets(release: str) -> tuple[Target, ...]:
    return _FLOOR.targets(release) + SGLANG_RULE


def required_prefill_tokens_per_rank(view) -> int:
    """Each rank's effective prefill budget as ``validate_mega_moe_token_budget`` requires it of the cap (0 where it
    requires nothing: pipeline parallelism with dynamic chunking; or no chunked prefill, which it refuses)."""
    from sglang.srt.runtime_context import attn_dp_enabled_of

    if (view.pp_size > 1 and view.enable_dynamic_chunking) or not view.chunked_prefill_size \
            or view.chunked_prefill_size <= 0:
        return 0
    if view.enable_prefill_cp:
        per_rank, alignment = -(-view.chunked_prefill_size // view.attn_cp_size), 1
    elif attn_dp_enabled_of(view):
        per_rank = view.chunked_prefill_size // view.attn_dp_size
        alignment = max(view.tp_size // view.attn_dp_size // view.attn_cp_size, 1)
    else:
        per_rank, alignment = view.chunked_prefill_size, max(view.tp_size // view.attn_cp_size, 1)
    return -(-per_rank // alignment) * alignment


def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
    """This server's floor terms: SGLang's rule for the models it checks, capwatch's computed one otherwise."""
    from sglang.srt.arg_groups import mega_moe_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.arg_groups.overrides import model_config_of

    found = _FLOOR.limits(server_args, sglang_version, release)
    view = resolved_view(server_args)
    model_config = model_config_of(server_args)
    if not mega_moe_hook.mega_moe_needs_token_budget(model_config.hf_config.architectures[0],
                                                     model_config.hf_quant_config, view.quantization):
        return found
    prefill = 0 if view.disaggregation_mode == "decode" else required_prefill_tokens_per_rank(view)
    return found.model_copy(update={"floor_rule": "sglang", "max_prefill_buffer_tokens": prefill})
