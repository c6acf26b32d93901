"""DeepEP's low-latency buffer as a backend (``--moe-a2a-backend deepep``): its parameters on the wire
(``DeepEPBuffer``, ``RankConfig.deepep``), priced by ``capwatch.sizing.deepep_plan.DeepEPPricing``, exported
as the ``moe_a2a_deepep_*`` series. How the engine allocates the buffer, asserts on its cap and experts and
reads its modes from its settings is the engine's (``RULES.engine_side``: SGLang's ``sglang_engine/deepep.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from capwatch.backends.spec import (
    LEADER_LAYER,
    PAIRS,
    BackendSeries,
    BackendSpec,
    Config,
    GaugeSeries,
    PlanOption,
    Planner,
    PlanTable,
    RankSizes,
    SettingsReader,
    engine_side,
    fits_cell,
    fits_header,
)
from capwatch.engines import ENGINE
from capwatch.sizing.byte_units import format_bytes
from capwatch.sizing.checks import MAX_NUM_EXPERTS, SizingError
from capwatch.sizing.deepep_low_latency import check_low_latency_hidden_size, low_latency_layout
from capwatch.sizing.deepep_plan import DEEPEP, DEEPEP_WORKSPACE_BYTES, NVSHMEM_HEAP_STEP_BYTES, DeepEPPricing
from capwatch.sizing.model_presets import ModelGeometry
from pydantic import BaseModel, ConfigDict, Field, model_validator



class DeepEPEnginePlan(Protocol):
    """One cap's buffer as the engine allocates it (``DeepEPEngineSide.plan_deepep_buffer``): what the spec reads."""

    model: str
    hidden_size: int
    num_experts: int
    ep_size: int
    cap: int
    deepep_mode: str
    redundant_experts: int
    fused_shared_experts: int
    buffer_experts: int  # what DeepEP is given: routed + redundant + fused shared slots
    low_latency_rdma_bytes: int
    normal_nvl_bytes: int
    normal_rdma_bytes: int
    buffer_bytes_per_rank: int
    buffer_bytes_group: int
    nvshmem_qp_depth: int
    nvshmem_heap_bytes_at_least: int
    memory_bytes_per_rank: int  # what a budget is held against

    @property
    def over_reserve_bytes(self) -> int: ...  # buffer bytes beyond the engine's reserve for DeepEP (0: within)

    def as_dict(self) -> dict: ...


@runtime_checkable
class DeepEPEngineSide(Protocol):
    """What the engine supplies for DeepEP (``RULES.engine_side``; SGLang's: ``sglang_engine/deepep.py``): its
    --deepep-mode values, what it asserts of the cap and the experts, how it allocates the buffer per cap, and how
    its logged settings read."""

    DEEPEP_MODES: tuple[str, ...]  # the modes with a low-latency buffer (a cap); the first is the default
    RESERVE_COLUMN: str  # the plan table's column of each cap's buffer against the engine's reserve

    def check_cap(self, cap: int) -> int: ...

    def check_buffer_experts(self, experts: int, ep_size: int) -> int: ...

    def prefill_dispatched(self, deepep_mode: str) -> bool: ...

    def settings_params(self, settings: SettingsReader) -> tuple[tuple[str, object], ...]: ...

    def plan_deepep_buffer(self, geometry: ModelGeometry, ep_size: int, cap: int, deepep_mode: str = "auto",
                           redundant_experts: int = 0, fused_shared_experts: int = 0, *,
                           qp_depth_environment: int | None = None) -> DeepEPEnginePlan: ...

    def largest_deepep_plan_within(self, budget_bytes: int, geometry: ModelGeometry, ep_size: int,
                                   deepep_mode: str = "auto", redundant_experts: int = 0,
                                   fused_shared_experts: int = 0, *, alignment: int = ...) -> DeepEPEnginePlan: ...

    def reserve_warning(self, plan: DeepEPEnginePlan, cap_variable: str) -> str: ...


RULES = ENGINE.bind_rules(DEEPEP)  # with the engine's variable for the cap, its words and its side
ALLOCATION = engine_side(RULES, DeepEPEngineSide)  # how the engine allocates the buffer: its modes, asserts, plan

DeepEPMode = Literal[ALLOCATION.DEEPEP_MODES]  # type: ignore[valid-type]


class DeepEPBuffer(BaseModel):
    """How SGLang sized this rank's DeepEP buffer beyond the cap and the hidden size (``sglang_engine/deepep.py``):
    what prices it at any other cap. The normal-mode bytes (``--deepep-mode auto``) do not depend on the cap."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    mode: DeepEPMode
    # The experts DeepEP is given: routed + --ep-num-redundant-experts + one slot per rank per fused shared expert.
    buffer_experts: Annotated[int, Field(ge=1, le=MAX_NUM_EXPERTS)]
    normal_nvl_bytes: Annotated[int, Field(ge=0, le=1 << 42)] = 0
    normal_rdma_bytes: Annotated[int, Field(ge=0, le=1 << 42)] = 0

    @model_validator(mode="after")
    def _low_latency_alone(self) -> "DeepEPBuffer":
        if self.mode == "low_latency" and (self.normal_nvl_bytes or self.normal_rdma_bytes):
            raise ValueError("a low_latency-mode DeepEP buffer has no normal-mode bytes (only --deepep-mode auto does)")
        return self


def _refusal(config: Config) -> str | None:
    """What SGLang or DeepEP would refuse of a deepep rank's config (the group's rule: ``_group_refusal``)."""
    if config.deepep is None:
        return "a deepep rank's config needs its deepep buffer (mode, buffer_experts)"
    if config.deepep.buffer_experts < config.num_experts:
        return (f"buffer_experts {config.deepep.buffer_experts} is below num_experts {config.num_experts}: DeepEP gets "
                "the routed experts plus redundant and fused shared ones")
    try:
        ALLOCATION.check_cap(config.cap)
        check_low_latency_hidden_size(config.hidden_size)
    except SizingError as error:
        return str(error)
    return None


def _group_refusal(config: Config, ep_size: int) -> str | None:
    try:
        ALLOCATION.check_buffer_experts(config.deepep.buffer_experts, ep_size)
        DeepEPPricing.of_config(config, ep_size).bytes_per_rank(config.cap)
    except SizingError as error:
        return str(error)
    return None


def _sizes(cap: int, ep_size: int, geometry: ModelGeometry, buffer: DeepEPBuffer | None) -> RankSizes:
    if buffer is None:
        raise SizingError("a deepep rank's config needs its deepep buffer (mode, buffer_experts)")
    ALLOCATION.check_buffer_experts(buffer.buffer_experts, ep_size)
    ALLOCATION.check_cap(cap)
    layout = low_latency_layout(cap, geometry.hidden_size, buffer.buffer_experts)
    return RankSizes(layout.dispatch_message_bytes, layout.combine_message_bytes,
                     DeepEPPricing.of_buffer(ep_size, geometry.hidden_size, buffer).bytes_per_rank(cap))


def _plan_options(values: Mapping[str, Any], geometry: ModelGeometry, ep_size: int, integer) -> dict:
    mode = (values["deepep_mode"] or "auto").strip().lower()
    if mode not in ALLOCATION.DEEPEP_MODES:
        raise SizingError(f"unknown --deepep-mode {mode!r}; choose one of {', '.join(ALLOCATION.DEEPEP_MODES)} "
                          "(normal mode has no low-latency buffer and no token cap)")
    if values["shared_experts_fusion"] and not geometry.shared_experts:
        raise SizingError(f"{geometry.name} has no shared experts to fuse: drop --shared-experts-fusion"
                          + (" or give --shared-experts S" if geometry.name == "custom" else ""))
    return dict(geometry=geometry, ep_size=ep_size, deepep_mode=mode,
                redundant_experts=integer("--redundant-experts", values["redundant_experts"] or "0", 0),
                fused_shared_experts=geometry.shared_experts if values["shared_experts_fusion"] else 0)


def _plan_table(plans: list, geometry: ModelGeometry, budget: int | None,
                caption: str | None) -> PlanTable:
    first = plans[0]
    extra = "".join(part for part in (
        f" + {first.redundant_experts} redundant" if first.redundant_experts else "",
        f" + {first.fused_shared_experts} x {first.ep_size} fused shared" if first.fused_shared_experts else ""))
    title = (f"{first.model}: H={first.hidden_size}, E={first.num_experts}{extra} -> DeepEP experts "
             f"{first.buffer_experts} | ep_size={first.ep_size}, deepep mode {first.deepep_mode}")
    normal = first.deepep_mode == "auto"
    headers = ["cap/rank", "low-latency RDMA"] + (["normal NVL", "normal RDMA"] if normal else []) + \
        ["buffer/rank", "bytes/rank", "memory/rank", "EP group", "NVSHMEM_QP_DEPTH", ALLOCATION.RESERVE_COLUMN] + \
        fits_header(budget)
    rows = []
    for plan in plans:
        row = [f"{plan.cap:,}", format_bytes(plan.low_latency_rdma_bytes)]
        if normal:
            row += [format_bytes(plan.normal_nvl_bytes), format_bytes(plan.normal_rdma_bytes)]
        row += [format_bytes(plan.buffer_bytes_per_rank), f"{plan.buffer_bytes_per_rank:,}",
                format_bytes(plan.memory_bytes_per_rank), format_bytes(plan.buffer_bytes_group),
                f"{plan.nvshmem_qp_depth:,}",
                f"+{format_bytes(plan.over_reserve_bytes)} over" if plan.over_reserve_bytes else "within"]
        row += fits_cell(plan.memory_bytes_per_rank, budget)
        rows.append(row)
    largest = max(plans, key=lambda plan: plan.cap)
    notes = ((f"largest 128-aligned cap whose memory/rank is within budget: {first.cap}",) if budget is not None
             else ()) + (
        f"memory/rank = the RDMA buffer as NVSHMEM maps it ({format_bytes(NVSHMEM_HEAP_STEP_BYTES)} steps: "
        f"{format_bytes(largest.nvshmem_heap_bytes_at_least)} at cap {largest.cap})"
        + (" + the NVLink buffer" if normal else "")
        + f" + DeepEP's {format_bytes(DEEPEP_WORKSPACE_BYTES)} workspace: what a budget is held against",)
    warnings = ()
    over = [plan for plan in plans if plan.over_reserve_bytes]
    if over:
        warnings = (ALLOCATION.reserve_warning(min(over, key=lambda plan: plan.cap), RULES.cap_env_var),)
    return PlanTable(title, tuple(headers), rows, caption, notes, warnings)


PLANNER = Planner(
    description=f"""\
--backend deepep prices {RULES.cap_env_var} (1..{RULES.max_cap_tokens}) in the deep_ep.Buffer {ENGINE.TITLE}
allocates for --moe-a2a-backend deepep: the low-latency RDMA buffer, plus normal mode's buffers with
--deepep-mode auto ({ENGINE.TITLE}'s default). Its experts are the routed ones + --redundant-experts + one slot per
rank per shared expert with --shared-experts-fusion ({ENGINE.TITLE}'s --enforce-shared-experts-fusion).""",
    options=(
        PlanOption("--deepep-mode", "deepep_mode", f"auto (default, {ENGINE.TITLE}'s: low-latency and normal buffers) "
                   "or low_latency", "MODE"),
        PlanOption("--redundant-experts", "redundant_experts", f"{ENGINE.TITLE}'s --ep-num-redundant-experts "
                   "(default 0)", "N"),
        PlanOption("--shared-experts-fusion", "shared_experts_fusion", f"{ENGINE.TITLE}'s "
                   "--enforce-shared-experts-fusion: one expert slot per rank per shared expert"),
        PlanOption("--shared-experts", "shared_experts", "shared experts of a custom geometry (a preset knows its own)",
                   "S"),
    ),
    group_title="DeepEP (--backend deepep)", ep_size_limit="", top_k_needed=False,
    bytes_field="memory_bytes_per_rank", prepare=_plan_options, plan_at=ALLOCATION.plan_deepep_buffer,
    largest_within=ALLOCATION.largest_deepep_plan_within, table=_plan_table)


def _settings_pricing(params, geometry: ModelGeometry, ep_size: int, alignment: int) -> tuple[DeepEPPricing, bool]:
    """The buffer the engine's DeepEP dispatcher allocates per cap, and whether prefill goes through it (low_latency
    mode); SizingError where the server has no capped buffer or it cannot be sized."""
    mode = params.get("deepep_mode") or ALLOCATION.DEEPEP_MODES[0]
    if mode not in ALLOCATION.DEEPEP_MODES:
        raise SizingError(f"the server runs --deepep-mode {mode}: it has no low-latency buffer and no per-rank token "
                          "cap; no advice")
    try:  # one cap prices the rest: the normal-mode bytes and the experts do not depend on it
        plan = ALLOCATION.plan_deepep_buffer(geometry, ep_size, alignment, mode, params.get("redundant_experts", 0),
                                             geometry.shared_experts if params.get("shared_experts_fusion") else 0)
    except SizingError as error:
        raise SizingError(f"DeepEP's buffer for this server cannot be sized: {error}") from None
    return DeepEPPricing(ep_size, geometry.hidden_size, plan.buffer_experts, plan.normal_nvl_bytes,
                         plan.normal_rdma_bytes), ALLOCATION.prefill_dispatched(mode)


SPEC = BackendSpec(
    rules=RULES, params=DeepEPBuffer, refusal=_refusal, group_refusal=_group_refusal,
    pricing=DeepEPPricing.of_config, sizes=_sizes,
    # Only in --deepep-mode low_latency: auto sends prefill to normal mode, which has no cap.
    prefill_dispatched=lambda buffer: buffer is None or ALLOCATION.prefill_dispatched(buffer.mode),
    series=BackendSeries(
        info_help=f"How {ENGINE.TITLE} sized this rank's DeepEP buffer: its --deepep-mode (value is always 1; present "
                  "only on DeepEP ranks).",
        info_labels=("mode",),
        gauges=(
            GaugeSeries("buffer_experts", "Experts DeepEP's low-latency buffer is sized for: routed + redundant + "
                        "fused shared-expert slots.", "experts"),
            GaugeSeries("normal_nvl_bytes", "Normal mode's NVLink buffer in this rank's DeepEP buffer (--deepep-mode "
                        "auto; 0 in low_latency): does not depend on the cap.", "bytes"),
            GaugeSeries("normal_rdma_bytes", "Normal mode's RDMA size hint (--deepep-mode auto): the RDMA buffer is "
                        "the larger of it and the low-latency size at the cap.", "bytes"),
        )),
    planner=PLANNER,
    settings_params=ALLOCATION.settings_params,
    settings_pricing=_settings_pricing,
    traffic_copies=PAIRS,
    traffic_sample=LEADER_LAYER,
    traffic_received_sample=("the layer after the step leader's in model order, so that a dispatch launches one op, "
                             "the leader's own in a role of one MoE layer"),
)
