"""MoRI's dispatch/combine op as a backend (``--moe-a2a-backend mori``, AMD): its parameters on the wire
(``MoriOp``, ``RankConfig.mori``), priced by ``capwatch.sizing.mori.MoriPricing`` (MoRI v1.2.2's allocations,
transcribed), exported as the ``moe_a2a_mori_*`` series. A batch above its cap corrupts memory silently in MoRI;
the plugin's guard (``sglang_plugin/hooks/mori.py``) refuses it after counting and reporting it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from capwatch.backends.spec import (
    LEADER_LAYER,
    PAIRS,
    SENT_ONLY,
    BackendSeries,
    BackendSpec,
    Config,
    GaugeSeries,
    PlanOption,
    Planner,
    PlanTable,
    RankSizes,
    SettingsReader,
    fits_cell,
    fits_header,
    within_budget_note,
)
from capwatch.engines import ENGINE
from capwatch.sizing.byte_units import format_bytes
from capwatch.sizing.caps import CAP_ALIGNMENT, MAX_CAP_TOKENS
from capwatch.sizing.checks import MAX_NUM_EXPERTS, SizingError
from capwatch.sizing.model_presets import ModelGeometry
from capwatch.sizing.mori import (
    COMBINE_QUANTS,
    KERNEL_TYPES,
    MORI,
    MORI_VERSION,
    PREALLOC_RECV_VARIABLE,
    MoriOpConfig,
    MoriOpPlan,
    MoriPricing,
    kernel_type,
    mori_op_plan,
)
from pydantic import BaseModel, ConfigDict, Field

RULES = ENGINE.bind_rules(MORI)  # with the engine's variable for the cap and the setting that picks its kernel

MoriKernel = Literal[KERNEL_TYPES]  # type: ignore[valid-type]
MoriCombineQuant = Literal[COMBINE_QUANTS]  # type: ignore[valid-type]


class MoriOp(BaseModel):
    """How SGLang configured this rank's MoRI op beyond the cap and the geometry (``init_mori_op``): what prices it
    at any other cap."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kernel: MoriKernel
    combine_quant: MoriCombineQuant = "none"
    experts_per_rank: Annotated[int, Field(ge=1, le=MAX_NUM_EXPERTS)]
    scale_dim: Annotated[int, Field(ge=0, le=1 << 16)] = 0  # per token (fp8: H / 128; fp4, mxfp8: H / 32)
    scale_type_size: Annotated[int, Field(ge=0, le=8)] = 0
    max_total_recv_tokens: Annotated[int, Field(ge=0, le=MAX_CAP_TOKENS * 1024)] = 0
    token_bytes: Annotated[int, Field(ge=1, le=8)] = 2  # max_token_type_size: the parameters' dtype (bf16: 2)


def _op_config(config: Config, ep_size: int, op: MoriOp) -> MoriOpConfig:
    return op_config(ep_size, config.hidden_size, config.top_k, op)


def op_config(ep_size: int, hidden_size: int, top_k: int, op: MoriOp) -> MoriOpConfig:
    """The op a rank reports, in a group of ``ep_size`` ranks (SizingError for one MoRI would not build)."""
    return MoriOpConfig(ep_size, hidden_size, top_k, op.experts_per_rank, op.kernel, token_bytes=op.token_bytes,
                        scale_dim=op.scale_dim, scale_type_size=op.scale_type_size, combine_quant=op.combine_quant,
                        max_total_recv_tokens=op.max_total_recv_tokens)


def _pricing(config: Config, ep_size: int) -> MoriPricing:
    op = getattr(config, MORI.name, None)
    if op is None or config.hidden_size is None or config.top_k is None:
        return MoriPricing(ep_size, None)
    try:
        return MoriPricing(ep_size, _op_config(config, ep_size, op))
    except SizingError:
        return MoriPricing(ep_size, None)


def _refusal(config: Config) -> str | None:
    """What MoRI would refuse of a mori rank's config (the group's rule: ``_group_refusal``)."""
    op = getattr(config, MORI.name)
    if op is None:
        return "a mori rank's config needs its mori op (kernel, experts_per_rank)"
    return None


def _group_refusal(config: Config, ep_size: int) -> str | None:
    try:
        _op_config(config, ep_size, config.mori)
    except SizingError as error:
        return str(error)
    return None


def _sizes(cap: int, ep_size: int, geometry: ModelGeometry, op: MoriOp | None) -> RankSizes:
    if op is None:
        raise SizingError("a mori rank's config needs its mori op (kernel, experts_per_rank)")
    config = op_config(ep_size, geometry.hidden_size, geometry.top_k, op)
    plan = mori_op_plan(config, cap)
    return RankSizes(plan.transfer_bytes_per_token, geometry.hidden_size * config.token_bytes, plan.op_bytes)


# --- capwatch plan --backend mori ----------------------------------------------------------------------------

def _plan_options(values: Mapping[str, Any], geometry: ModelGeometry, ep_size: int, integer) -> dict:
    if geometry.num_experts % ep_size:
        raise SizingError(f"{geometry.num_experts} experts do not divide among {ep_size} ranks")
    return dict(geometry=geometry, ep_size=ep_size, low_latency=bool(values["mori_low_latency"]))


def _op_at(geometry: ModelGeometry, ep_size: int, low_latency: bool, cap: int) -> MoriOpConfig:
    return MoriOpConfig(ep_size, geometry.hidden_size, geometry.top_k, geometry.num_experts // ep_size,
                        kernel_type(ep_size, cap, low_latency))


def plan_mori_op(*, cap: int, geometry: ModelGeometry, ep_size: int, low_latency: bool = False) -> MoriOpPlan:
    """One op at ``cap`` as the server builds it for a bf16 model (bf16 dispatch and combine)."""
    MORI.check_cap(cap)
    return mori_op_plan(_op_at(geometry, ep_size, low_latency, cap), cap)


def largest_mori_plan_within(budget: int, *, geometry: ModelGeometry, ep_size: int, low_latency: bool = False,
                             alignment: int = CAP_ALIGNMENT) -> MoriOpPlan:
    pricing = MoriPricing(ep_size, _op_at(geometry, ep_size, low_latency, alignment))
    cap = pricing.largest_cap_fitting(budget, alignment)
    return plan_mori_op(cap=cap, geometry=geometry, ep_size=ep_size, low_latency=low_latency)


def _plan_table(plans: list[MoriOpPlan], geometry: ModelGeometry, budget: int | None,
                caption: str | None) -> PlanTable:
    first = plans[0]
    title = (f"{geometry.name}: H={geometry.hidden_size}, top-k={geometry.top_k}, E={geometry.num_experts} | "
             f"MoRI op, kernel {first.kernel}, bf16")
    headers = ["cap/rank", "received tokens", "transfer B/tok", "token buffers", "weights, scales, indices",
               "order maps", "op/rank", "bytes/rank"] + fits_header(budget)
    rows = []
    for plan in plans:
        row = [f"{plan.cap:,}", f"{plan.received_tokens:,}", f"{plan.transfer_bytes_per_token:,}",
               format_bytes(plan.token_buffers_bytes), format_bytes(plan.weights_scales_indices_bytes),
               format_bytes(plan.order_maps_bytes), format_bytes(plan.op_bytes), f"{plan.op_bytes:,}"]
        rows.append(row + fits_cell(plan.op_bytes, budget))
    notes = within_budget_note(first.cap, budget) + (
        f"MoRI v{MORI_VERSION}'s allocations, transcribed from its C++ (no MoRI runs here to check them); they live "
        "in MoRI's symmetric heap (MORI_SHMEM_HEAP_SIZE), which must hold them",)
    warnings = ("warning: a batch above the cap corrupts memory silently in MoRI (ROCm/mori#356); capwatch's plugin "
                "refuses it, the server checks only the prefill chunk at start-up",)
    return PlanTable(title, tuple(headers), rows, caption, notes, warnings)


PLANNER = Planner(
    description=f"""\
--backend mori prices the per-rank cap of --moe-a2a-backend mori (AMD) in the MoRI EPv1
dispatch/combine op built for it: IntraNode on up to 8 ranks, InterNodeV1(LL)
beyond, AsyncLL with --mori-low-latency; MoRI v{MORI_VERSION}'s allocations, bf16.""",
    options=(PlanOption("--mori-low-latency", "mori_low_latency", "the server's low-latency mode: MoRI's AsyncLL "
                                                                  "kernel"),),
    group_title="MoRI (--backend mori)", ep_size_limit="", top_k_needed=True, bytes_field="op_bytes",
    prepare=_plan_options, plan_at=plan_mori_op, largest_within=largest_mori_plan_within, table=_plan_table)


# --- the log reader -----------------------------------------------------------------------------------------

def _settings_params(settings: SettingsReader) -> tuple[tuple[str, object], ...]:
    """MoRI's op beyond the model: the server arg that picks its kernel (SGLang's --deepep-mode, bound as
    ``RULES.mode_setting``; low_latency: AsyncLL; auto becomes normal)."""
    return (("low_latency", settings.text(RULES.mode_setting) == "low_latency"),)


def _settings_pricing(params, geometry: ModelGeometry, ep_size: int, alignment: int) -> tuple[MoriPricing, bool]:
    if geometry.num_experts % ep_size:
        raise SizingError(f"MoRI's op for this server cannot be sized: {geometry.num_experts} experts do not divide "
                          f"among {ep_size} ranks")
    try:
        config = _op_at(geometry, ep_size, bool(params.get("low_latency")), alignment)
    except SizingError as error:
        raise SizingError(f"MoRI's op for this server cannot be sized: {error}") from None
    return MoriPricing(ep_size, config), True


SPEC = BackendSpec(
    rules=RULES, params=MoriOp, refusal=_refusal, group_refusal=_group_refusal, pricing=_pricing, sizes=_sizes,
    prefill_dispatched=lambda op: True,  # normal and low-latency mode alike: every batch meets the cap
    series=BackendSeries(
        info_help="How the server configured this rank's MoRI op: its kernel and combine quantization (value is always "
                  "1; present only on MoRI ranks).",
        info_labels=("kernel", "combine_quant"),
        gauges=(
            GaugeSeries("experts_per_rank", "Experts per rank MoRI's op is built for (its order maps grow with "
                        "them).", "experts"),
            GaugeSeries("scale_dim", "Dispatch scales per token (0: bf16 dispatch).", "scales"),
            GaugeSeries("scale_type_size", "Bytes per dispatch scale.", "bytes"),
            GaugeSeries("max_total_recv_tokens", f"{PREALLOC_RECV_VARIABLE}: a smaller receive buffer (0: every "
                        "rank's cap).", "tokens"),
            GaugeSeries("token_bytes", "Bytes per token element MoRI's buffers are sized for (the parameters' dtype, "
                        "whatever the dispatch dtype).", "bytes"),
        )),
    planner=PLANNER,
    settings_params=_settings_params,
    settings_pricing=_settings_pricing,
    traffic_copies=PAIRS,
    traffic_sample=LEADER_LAYER,
    traffic_received_sample=SENT_ONLY,
)
