"""pplx-kernels' ``AllToAll`` as a backend (``--moe-a2a-backend pplx``): its parameters on the wire (``PplxAllToAll``,
``RankConfig.pplx``), priced by ``capwatch.sizing.pplx.PplxPricing`` (pplx-kernels' constructors' allocations,
transcribed), exported as the ``moe_a2a_pplx_*`` series."""

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
from capwatch.sizing.byte_units import format_bytes
from capwatch.sizing.caps import CAP_ALIGNMENT
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import ModelGeometry
from capwatch.sizing.pplx import (
    PPLX,
    PPLX_COMMIT,
    TRANSPORTS,
    PplxConfig,
    PplxPlan,
    PplxPricing,
    fp8_scale_bytes,
    pplx_plan,
)
from pydantic import BaseModel, ConfigDict, Field

PplxTransport = Literal[TRANSPORTS]  # type: ignore[valid-type]
DispatchDtype = Literal["bf16", "fp8"]
MAX_DP_SIZE = 1 << 12


class PplxAllToAll(BaseModel):
    """How the server built this rank's pplx ``AllToAll`` beyond the cap and the geometry: what prices it at any
    other cap."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    transport: PplxTransport  # intranode (one node, CUDA IPC) or internode (NVSHMEM)
    dp_size: Annotated[int, Field(ge=1, le=MAX_DP_SIZE)]  # ranks per DP group: the attention-TP size
    dispatch_dtype: DispatchDtype = "fp8"
    params_bytes: Annotated[int, Field(ge=1, le=8)] = 2  # the parameters' element size: a bf16 dispatch's bytes


def config_of(ep_size: int, hidden_size: int, num_experts: int, all_to_all: PplxAllToAll) -> PplxConfig:
    """The ``AllToAll`` a rank reports, in a group of ``ep_size`` ranks (SizingError for one pplx would refuse)."""
    fp8 = all_to_all.dispatch_dtype == "fp8"
    return PplxConfig(ep_size, all_to_all.dp_size, num_experts, hidden_size,
                      hidden_size * (1 if fp8 else all_to_all.params_bytes),
                      fp8_scale_bytes(hidden_size) if fp8 else 0, all_to_all.transport)


def _pricing(config: Config, ep_size: int) -> PplxPricing:
    all_to_all = getattr(config, PPLX.name, None)
    if all_to_all is None or config.hidden_size is None or config.num_experts is None:
        return PplxPricing(ep_size, None)
    try:
        return PplxPricing(ep_size, config_of(ep_size, config.hidden_size, config.num_experts, all_to_all))
    except SizingError:
        return PplxPricing(ep_size, None)


def _refusal(config: Config) -> str | None:
    if getattr(config, PPLX.name) is None:
        return "a pplx rank's config needs its pplx AllToAll (transport, dp_size)"
    return None


def _group_refusal(config: Config, ep_size: int) -> str | None:
    try:
        config_of(ep_size, config.hidden_size, config.num_experts, config.pplx)
    except SizingError as error:
        return str(error)
    return None


def _sizes(cap: int, ep_size: int, geometry: ModelGeometry, all_to_all: PplxAllToAll | None) -> RankSizes:
    if all_to_all is None:
        raise SizingError("a pplx rank's config needs its pplx AllToAll (transport, dp_size)")
    plan = pplx_plan(config_of(ep_size, geometry.hidden_size, geometry.num_experts, all_to_all), cap)
    return RankSizes(plan.dispatch_bytes_per_token, geometry.hidden_size * all_to_all.params_bytes,
                     plan.all_to_all_bytes)


# --- capwatch plan --backend pplx ----------------------------------------------------------------------------

def _plan_options(values: Mapping[str, Any], geometry: ModelGeometry, ep_size: int, integer) -> dict:
    dp_size = values.get("pplx_dp_size")
    all_to_all = PplxAllToAll(transport="internode" if values.get("pplx_internode") else "intranode",
                              dp_size=1 if dp_size is None else integer("--pplx-dp-size", dp_size, 1),
                              dispatch_dtype="bf16" if values.get("pplx_bf16") else "fp8")
    config_of(ep_size, geometry.hidden_size, geometry.num_experts, all_to_all)  # SizingError for what pplx refuses
    return dict(geometry=geometry, ep_size=ep_size, all_to_all=all_to_all)


def plan_pplx(*, cap: int, geometry: ModelGeometry, ep_size: int, all_to_all: PplxAllToAll) -> PplxPlan:
    PPLX.check_cap(cap)
    return pplx_plan(config_of(ep_size, geometry.hidden_size, geometry.num_experts, all_to_all), cap)


def largest_pplx_plan_within(budget: int, *, geometry: ModelGeometry, ep_size: int, all_to_all: PplxAllToAll,
                             alignment: int = CAP_ALIGNMENT) -> PplxPlan:
    pricing = PplxPricing(ep_size, config_of(ep_size, geometry.hidden_size, geometry.num_experts, all_to_all))
    cap = pricing.largest_cap_fitting(budget, alignment)
    return plan_pplx(cap=cap, geometry=geometry, ep_size=ep_size, all_to_all=all_to_all)


def _plan_table(plans: list[PplxPlan], geometry: ModelGeometry, budget: int | None,
                caption: str | None) -> PlanTable:
    first = plans[0]
    title = (f"{geometry.name}: H={geometry.hidden_size}, E={geometry.num_experts} | pplx AllToAll, "
             f"{first.transport}")
    headers = ["cap/rank", "dispatch B/tok", "token buffers", "symmetric heap", "counts, tracking",
               "AllToAll/rank", "bytes/rank"] + fits_header(budget)
    rows = []
    for plan in plans:
        row = [f"{plan.cap:,}", f"{plan.dispatch_bytes_per_token:,}", format_bytes(plan.token_buffers_bytes),
               format_bytes(plan.symmetric_heap_bytes), format_bytes(plan.counts_and_tracking_bytes),
               format_bytes(plan.all_to_all_bytes), f"{plan.all_to_all_bytes:,}"]
        rows.append(row + fits_cell(plan.all_to_all_bytes, budget))
    notes = within_budget_note(first.cap, budget) + (
        f"pplx-kernels' AllToAll allocations at commit {PPLX_COMMIT}, transcribed from its C++ (no pplx-kernels runs "
        "here to check them); the server's per-call expert input and combine output are not included",)
    return PlanTable(title, tuple(headers), rows, caption, notes)


PLANNER = Planner(
    description=f"""\
--backend pplx prices the per-rank cap of --moe-a2a-backend pplx in the pplx-kernels
AllToAll built for it: intranode (one node) by default, internode (NVSHMEM) with
--pplx-internode; fp8 dispatch unless --pplx-bf16; --pplx-dp-size is the attention-TP
size (ranks per DP group, default 1); pplx-kernels {PPLX_COMMIT}'s allocations.""",
    options=(PlanOption("--pplx-internode", "pplx_internode", "the group spans nodes: pplx's NVSHMEM AllToAll"),
             PlanOption("--pplx-bf16", "pplx_bf16", "a bf16 dispatch (the server's default is fp8)"),
             PlanOption("--pplx-dp-size", "pplx_dp_size", "ranks per DP group: the attention-TP size (default 1)",
                        "N")),
    group_title="pplx (--backend pplx)", ep_size_limit="", top_k_needed=False, bytes_field="all_to_all_bytes",
    prepare=_plan_options, plan_at=plan_pplx, largest_within=largest_pplx_plan_within, table=_plan_table)


# --- the log reader -----------------------------------------------------------------------------------------

def _settings_params(settings: SettingsReader) -> tuple[tuple[str, object], ...]:
    """The AllToAll beyond the model: the nodes (internode past one) and the attention-DP size (``attn_dp_size``
    from 0.5.22 on, ``dp_size`` with DP attention before), whose quotient of the TP size is the ranks per DP group.
    Not the dispatch dtype: the server resolves it from the model's quantization at run time, so the log's pricing
    takes both (``_settings_pricing``)."""
    attn_dp_size = settings.size("attn_dp_size", 0, least=0)
    if attn_dp_size <= 1 and settings.flag("enable_dp_attention"):
        attn_dp_size = settings.size("dp_size", 1, least=1)
    return (("nnodes", settings.size("nnodes", 1, least=1)), ("tp_size", settings.size("tp_size", 1, least=1)),
            ("attn_dp_size", max(1, attn_dp_size)))


def _settings_pricing(params, geometry: ModelGeometry, ep_size: int, alignment: int) -> tuple[PplxPricing, bool]:
    attn_dp_size = params.get("attn_dp_size", 1)
    if attn_dp_size < 2:
        raise SizingError("pplx's AllToAll for this server cannot be sized: pplx needs DP attention with at least 2 "
                          "DP groups, and the server's args have none")
    attention_tp = max(1, params.get("tp_size", ep_size) // attn_dp_size)
    transport = "internode" if params.get("nnodes", 1) > 1 else "intranode"
    configs, refused = [], []
    for dtype in ("bf16", "fp8"):  # a dtype pplx would refuse for this model is no server's
        try:
            configs.append(config_of(ep_size, geometry.hidden_size, geometry.num_experts,
                                     PplxAllToAll(transport=transport, dp_size=attention_tp, dispatch_dtype=dtype)))
        except SizingError as error:
            refused.append(str(error))
    if not configs:
        raise SizingError(f"pplx's AllToAll for this server cannot be sized: {refused[0]}")
    # Priced where both dtypes allocate the same (intranode: the combine buffers, 4 bytes a channel, dominate)
    prices = {(pplx_plan(config, alignment).all_to_all_bytes, pplx_plan(config, 2 * alignment).all_to_all_bytes)
              for config in configs}
    if len(prices) > 1:
        raise SizingError("pplx's AllToAll for this server cannot be sized from its log: its internode buffers "
                          "depend on the dispatch dtype (fp8 or bf16, resolved from the model's quantization at run "
                          "time), which a log does not say; the ranks' reports carry it")
    return PplxPricing(ep_size, configs[0]), True


SPEC = BackendSpec(
    rules=PPLX, params=PplxAllToAll, refusal=_refusal, group_refusal=_group_refusal, pricing=_pricing, sizes=_sizes,
    prefill_dispatched=lambda all_to_all: True,  # low-latency mode only: every batch meets the cap
    series=BackendSeries(
        info_help="How the server built this rank's pplx AllToAll: its transport and dispatch dtype (value is always "
                  "1; present only on pplx ranks).",
        info_labels=("transport", "dispatch_dtype"),
        gauges=(
            GaugeSeries("dp_size", "Ranks per DP group the AllToAll is built for (the attention-TP size).", "ranks"),
            GaugeSeries("params_bytes", "Bytes per element of the parameters (a bf16 dispatch's token bytes).",
                        "bytes"),
        )),
    planner=PLANNER,
    settings_params=_settings_params,
    settings_pricing=_settings_pricing,
    traffic_copies=PAIRS,
    traffic_sample=LEADER_LAYER,
    traffic_received_sample=SENT_ONLY,
)
