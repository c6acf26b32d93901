"""FlashInfer's MoE A2A as a backend (``--moe-a2a-backend flashinfer``): its workspace priced by
``capwatch.sizing.flashinfer_plan.plan_workspace`` (every layout), its parameters on the wire (``FlashInferParams``,
``RankConfig.flashinfer``: the payload format, the release, the EPLB stats region; the wire's first backend, so
the same fields at the config's top level are still read), exported on ``moe_a2a_info`` and
``moe_a2a_eplb_stats_experts`` as before."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from capwatch.backends.spec import (
    BackendSeries,
    BackendSpec,
    Config,
    GaugeSeries,
    PlanOption,
    Planner,
    PlanTable,
    RankSizes,
    engine_side,
    fits_cell,
    fits_header,
)
from capwatch.engines import ENGINE
from capwatch.sizing.byte_units import format_bytes
from capwatch.sizing.checks import MAX_NUM_EXPERTS, SizingError
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.flashinfer_one_sided import LAMPORT_MAX_TOKENS_PER_RANK, OFFLINE_UNSIZED_REGIONS
from capwatch.sizing.flashinfer_releases import (
    LAYOUT_MOE_A2A,
    FLASHINFER,
    MAX_EP_SIZE,
    SUPPORTED_FLASHINFER_VERSIONS,
    FlashInferVersion,
    check_eplb_stats,
    check_routing,
)
from capwatch.sizing.model_presets import ModelGeometry, custom_geometry
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token
from capwatch.sizing.payloads import SIZING_PAYLOAD_FORMATS, hidden_bytes_per_token
from capwatch.sizing.flashinfer_plan import WorkspacePlan, plan_workspace
from capwatch.sizing.reported import MAX_BUFFER_BYTES
from capwatch.sizing.price_basis import ESTIMATED, EXACT, PriceBasis
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# Built from sizing's own tuple, so a format it gains is accepted on the wire too (an enum in the OpenAPI schema).
PayloadFormat = Literal[SIZING_PAYLOAD_FORMATS]  # type: ignore[valid-type]
_RELEASES = [FlashInferVersion.parse(version) for version in SUPPORTED_FLASHINFER_VERSIONS]


class FlashInferParams(BaseModel):
    """What prices this rank's FlashInfer workspace beyond the cap and the geometry, each field what FlashInfer
    itself would accept (the release known, its EPLB stats region in it; pydantic validates fields in this order,
    so each check sees the fields before it). Against the geometry: the spec's refusal."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    payload_format: PayloadFormat = "bf16"
    flashinfer_version: Annotated[str, Field(max_length=32)] | None = None
    eplb_stats_num_experts: Annotated[int, Field(ge=0, le=MAX_NUM_EXPERTS)] = 0
    # 0.7.4's NVLinkOneSidedAlltoAll as built (FlashInferMoeEpBackend.built_workspace()): the optional regions it
    # turned on, which depend on the run's hardware, and its own figure for its bytes per rank at the rank's cap.
    cft: Annotated[bool, Field(strict=False)] = False  # lax: read back from its 0/1 gauge
    lamport_max_tokens: Annotated[int, Field(ge=0, le=LAMPORT_MAX_TOKENS_PER_RANK)] = 0
    built_workspace_bytes: Annotated[int, Field(ge=1, le=MAX_BUFFER_BYTES)] | None = None

    @field_validator("flashinfer_version")
    @classmethod
    def _known_release(cls, version: str | None) -> str | None:
        if version is not None:
            FlashInferVersion.parse(version)  # SizingError (a ValueError): unknown or malformed
        return version

    @field_validator("eplb_stats_num_experts")
    @classmethod
    def _eplb_stats_in_release(cls, experts: int, info: ValidationInfo) -> int:
        if "flashinfer_version" in info.data:  # else that field already failed
            check_eplb_stats(experts, FlashInferVersion.parse(info.data["flashinfer_version"]))
        return experts

    @field_validator("cft", "lamport_max_tokens", "built_workspace_bytes")
    @classmethod
    def _built_one_sided(cls, value, info: ValidationInfo):
        if value and "flashinfer_version" in info.data \
                and FlashInferVersion.parse(info.data["flashinfer_version"]).layout == LAYOUT_MOE_A2A:
            version = info.data["flashinfer_version"] or f"unset ({FlashInferVersion.parse(None).version})"
            raise ValueError(f"{info.field_name} describes flashinfer 0.7.4's NVLinkOneSidedAlltoAll; "
                             f"flashinfer_version is {version}")
        return value


DEFAULT_PARAMS = FlashInferParams()

@runtime_checkable
class FlashInferEngineSide(Protocol):
    """What the engine supplies for FlashInfer (``RULES.engine_side``; SGLang's: ``sglang_engine/flashinfer.py``):
    how its dispatcher sizes the workspace it asks for, as ``capwatch plan``'s modes, each an allocation of
    ``sizing/flashinfer_plan.py``."""

    MODES: tuple[str, ...]  # --mode's values
    MODES_HELP: str  # the planner's paragraph on them
    MODE_OPTION_HELP: str
    DRAFT_OPTION_HELP: str

    def default_mode(self, flashinfer_version: str | None, eplb_stats_num_experts) -> str: ...

    def plan_workspace(self, geometry: ModelGeometry, ep_size: int, cap: int, payload_format: str = "bf16",
                       eplb_stats_num_experts: int = 0, flashinfer_version: str | None = None,
                       mode: str = "flashinfer", draft: bool = False, **layout_options) -> WorkspacePlan: ...

    def largest_plan_within(self, budget_bytes: int, geometry: ModelGeometry, ep_size: int,
                            payload_format: str = "bf16", eplb_stats_num_experts: int = 0,
                            flashinfer_version: str | None = None, mode: str = "flashinfer", draft: bool = False,
                            **options) -> WorkspacePlan: ...


RULES = ENGINE.bind_rules(FLASHINFER)  # with the engine's variable for the cap and its side
ALLOCATIONS = engine_side(RULES, FlashInferEngineSide)  # capwatch plan's modes: the engine's allocations


@dataclass(frozen=True)
class WorkspacePricing:
    """What one rank's workspace costs per cap (everything but the cap comes from the reports).

    Built from a report with ``of_config``: the geometry and format are then known, so every layout
    prices (0.7.4's ``NVLinkOneSidedAlltoAll`` sizes from them; ``moe_a2a`` from the reported bytes
    per token). Without a geometry only the ``moe_a2a`` layout can be priced (its inputs are the
    bytes per token alone); without those either (a source that does not see them: None), nothing is."""

    ep_size: int
    dispatch_bytes_per_token: int | None
    combine_bytes_per_token: int | None
    eplb_stats_num_experts: int = 0
    flashinfer_version: str | None = None
    geometry: ModelGeometry | None = None
    payload_format: str = "bf16"
    # 0.7.4, as built: its CFT and Lamport regions, and (cap, bytes) its own figure at the cap it was built for. That
    # cap prices at the figure; every other at the layout with the same regions (docs/sizing.md, "0.7.4 as built").
    cft: bool = False
    lamport_max_tokens: int = 0
    built: tuple[int, int] | None = None

    @classmethod
    def of_config(cls, config, ep_size: int) -> "WorkspacePricing":
        """The pricing of a rank's config (a ``RankConfig``, or a source's ``UnpricedConfig``) in a group of
        ``ep_size`` ranks."""
        geometry = (custom_geometry(config.hidden_size, config.top_k, config.num_experts)
                    if config.hidden_size is not None else None)  # a source that cannot see it
        params = config.flashinfer
        if params is None:  # a source that read parameters no rank could report: nothing is priced
            return cls(ep_size, None, None)
        built = (None if params.built_workspace_bytes is None or getattr(config, "cap", None) is None
                 else (config.cap, params.built_workspace_bytes))
        return cls(ep_size, config.dispatch_bytes_per_token, config.combine_bytes_per_token,
                   params.eplb_stats_num_experts, params.flashinfer_version, geometry, params.payload_format,
                   params.cft, params.lamport_max_tokens, built)

    def plan(self, cap: int) -> WorkspacePlan:
        if self.geometry is None:
            raise SizingError("pricing without the model geometry knows only the moe_a2a layout")
        return plan_workspace(self.geometry, self.ep_size, cap, self.payload_format, self.eplb_stats_num_experts,
                              self.flashinfer_version,
                              bytes_per_token=(self.dispatch_bytes_per_token, self.combine_bytes_per_token),
                              cft=self.cft, lamport_max_tokens=self.lamport_max_tokens)

    def bytes_per_rank(self, cap: int) -> int:
        return _bytes_per_rank(self, cap)

    def basis_at(self, cap: int) -> PriceBasis:
        """Exact, but for one case of 0.7.4 as built: where the cap clamped the Lamport limit (limit = built cap),
        a larger cap could let the run pick more, so its price counts the Lamport regions at the built limit: a
        lower bound (docs/sizing.md, "0.7.4 as built")."""
        if (self.built is not None and 0 < self.lamport_max_tokens == self.built[0] < cap
                and self.lamport_max_tokens < LAMPORT_MAX_TOKENS_PER_RANK):
            return PriceBasis(False, f"a lower bound: the Lamport regions priced at the {self.lamport_max_tokens} "
                                     f"tokens built at cap {self.built[0]} (the cap clamped them); a larger cap may "
                                     f"let the run pick more, up to {LAMPORT_MAX_TOKENS_PER_RANK}",
                              self.built[0], self.built[1])
        return EXACT if self.known_bytes_per_rank(cap) is not None else ESTIMATED

    def known_bytes_per_rank(self, cap: int) -> int | None:
        """``bytes_per_rank``, or None where this configuration cannot be priced (e.g. an unknown flashinfer
        version): a view then says nothing rather than guess."""
        try:
            return self.bytes_per_rank(cap)
        except SizingError:
            return None


@functools.lru_cache(maxsize=1 << 16)
def _bytes_per_rank(pricing: WorkspacePricing, cap: int) -> int:
    # Cached by value (the pricing is frozen): every view prices each rank's cap and the advisor the same caps
    # again on each recompute; thousands of groups made pricing half the list's work.
    if pricing.dispatch_bytes_per_token is None or pricing.combine_bytes_per_token is None:
        raise SizingError("the payload bytes per token are not known, so no workspace can be priced")
    if pricing.built is not None and cap == pricing.built[0]:
        return pricing.built[1]  # the built object's own figure (0.7.4: exact whatever regions it turned on)
    if pricing.geometry is None:  # moe_a2a's own inputs: the bytes per token
        return workspace_bytes_per_rank(
            pricing.ep_size, cap, pricing.dispatch_bytes_per_token, pricing.combine_bytes_per_token,
            pricing.eplb_stats_num_experts, pricing.flashinfer_version)
    return pricing.plan(cap).workspace_bytes_per_rank


def _refusal(config: Config) -> str | None:
    params = config.flashinfer
    if params is None:
        return "a flashinfer rank's config needs its flashinfer parameters"
    if params.eplb_stats_num_experts > config.num_experts:
        return (f"eplb_stats_num_experts {params.eplb_stats_num_experts} exceeds num_experts {config.num_experts}: "
                "the stats region holds one counter per expert")
    if params.lamport_max_tokens > config.cap:
        return (f"lamport_max_tokens {params.lamport_max_tokens} exceeds the cap {config.cap}: the built object "
                "clamps its Lamport limit to the cap")
    return _routing_refusal(config.top_k, config.num_experts, config.hidden_size, params.payload_format,
                            params.flashinfer_version)


@functools.lru_cache(maxsize=4096)
def _routing_refusal(top_k: int, num_experts: int, hidden_size: int, payload_format: str,
                     flashinfer_version: str | None) -> str | None:
    # Cached: every report of a rank repeats its config, and this ran for each one.
    try:
        check_routing(top_k, num_experts, 1, FlashInferVersion.parse(flashinfer_version))
        hidden_bytes_per_token(hidden_size, payload_format)
    except SizingError as error:
        return str(error)
    return None


def _group_refusal(config: Config, ep_size: int) -> str | None:
    params = config.flashinfer
    try:
        plan = plan_workspace(custom_geometry(config.hidden_size, config.top_k, config.num_experts), ep_size,
                              config.cap, params.payload_format, params.eplb_stats_num_experts,
                              params.flashinfer_version,
                              bytes_per_token=(config.dispatch_bytes_per_token, config.combine_bytes_per_token),
                              cft=params.cft, lamport_max_tokens=params.lamport_max_tokens)
    except SizingError as error:
        return str(error)
    return _built_below_layout(params, plan)


def _built_below_layout(params: FlashInferParams, plan: WorkspacePlan) -> str | None:
    """A built figure below 0.7.4's layout with the regions it reported: no such object exists (what the layout
    leaves out, extra payload bytes per token, only adds), so the figure is not one FlashInfer could report."""
    if params.built_workspace_bytes is None or params.built_workspace_bytes >= plan.workspace_bytes_per_rank:
        return None
    return (f"built_workspace_bytes {params.built_workspace_bytes} is below {plan.workspace_bytes_per_rank}, flashinfer "
            f"0.7.4's workspace at cap {plan.cap} with these regions (cft {params.cft}, lamport_max_tokens "
            f"{params.lamport_max_tokens}): report the object's int(metainfo[WORKSPACE_SIZE_INDEX])")


def _sizes(cap: int, ep_size: int, geometry: ModelGeometry, params: FlashInferParams | None) -> RankSizes:
    params = params or DEFAULT_PARAMS
    plan = plan_workspace(geometry, ep_size, cap, params.payload_format, params.eplb_stats_num_experts,
                          params.flashinfer_version, cft=params.cft, lamport_max_tokens=params.lamport_max_tokens)
    refusal = _built_below_layout(params, plan)
    if refusal is not None:
        raise SizingError(refusal)
    # Where the object was built, its own figure is what the rank reports (and exports on moe_a2a_workspace_bytes).
    return RankSizes(plan.dispatch_bytes_per_token, plan.combine_bytes_per_token,
                     params.built_workspace_bytes or plan.workspace_bytes_per_rank)


def _plan_options(values: Mapping[str, Any], geometry: ModelGeometry, ep_size: int, integer) -> dict:
    mode = values["mode"] or ALLOCATIONS.default_mode(values["flashinfer_version"], values["eplb_stats_experts"])
    if mode not in ALLOCATIONS.MODES:
        raise SizingError(f"unknown --mode {mode!r}; choose one of {', '.join(ALLOCATIONS.MODES)}")
    return dict(geometry=geometry, ep_size=ep_size, payload_format=(values["payload_format"] or "bf16").strip().lower(),
                eplb_stats_num_experts=integer("--eplb-stats-experts", values["eplb_stats_experts"] or "0", 0),
                flashinfer_version=values["flashinfer_version"], mode=mode, draft=values["draft"],
                lamport_max_tokens=integer("--lamport-tokens", values["lamport_tokens"] or "0", 0),
                cft=bool(values["cft"]))


def _plan_table(plans: list[WorkspacePlan], geometry: ModelGeometry, budget: int | None,
                caption: str | None) -> PlanTable:
    first = plans[0]
    title = (f"{geometry.name}: H={geometry.hidden_size}, top-k={geometry.top_k}, E={geometry.num_experts} | "
             f"ep_size={first.ep_size}, {first.payload_format}, flashinfer {first.flashinfer_version} "
             f"({first.layout}), mode {first.mode}{', draft' if first.draft else ''}"
             + (f", EPLB stats {first.eplb_stats_num_experts}" if first.eplb_stats_num_experts else ""))
    headers = ["cap/rank", "max_num_tokens", "dispatch B/tok", "combine B/tok", "aux", "workspace/rank", "bytes/rank",
               "EP group", "expert rows"]
    show_lamport = any(plan.lamport_bytes for plan in plans)
    headers += ["of which Lamport"] if show_lamport else []
    headers += fits_header(budget)
    rows = []
    for plan in plans:
        row = [f"{plan.cap:,}", f"{plan.max_num_tokens:,}", f"{plan.dispatch_bytes_per_token:,}",
               f"{plan.combine_bytes_per_token:,}", format_bytes(plan.aux_bytes),
               format_bytes(plan.workspace_bytes_per_rank), f"{plan.workspace_bytes_per_rank:,}",
               format_bytes(plan.workspace_bytes_group), f"{plan.expert_rows:,}"]
        row += [format_bytes(plan.lamport_bytes)] if show_lamport else []
        row += fits_cell(plan.workspace_bytes_per_rank, budget)
        rows.append(row)
    notes = ()
    if budget is not None:
        at_limit = first.cap == FLASHINFER.max_cap_tokens
        notes = (f"largest 128-aligned cap within budget: {first.cap}"
                 + (" (the largest cap capwatch sizes; the budget holds more)" if at_limit else ""),)
    return PlanTable(title, tuple(headers), rows, caption, notes + _unsized_notes(first))


def _unsized_notes(plan: WorkspacePlan) -> tuple[str, ...]:
    """0.7.4: the optional regions this plan leaves out, which FlashInfer turns on at run time where the hardware
    supports them: not sized offline (the plugin and FlashInferMoeEpBackend report the built object's bytes)."""
    if plan.layout == LAYOUT_MOE_A2A:
        return ()
    sized_in = {"cft": plan.cft, "lamport": plan.lamport_bytes > 0}
    left_out = [region for name, region in OFFLINE_UNSIZED_REGIONS.items() if not sized_in[name]]
    if not left_out:
        return ()
    return (f"not sized offline, left out of these figures: {'; '.join(left_out)}. Where a run turns them on, its "
            "workspace is larger: read moe_a2a_workspace_bytes from a rank (the built object's own figure), or give "
            "--cft / --lamport-tokens T as the run settled them",)


PLANNER = Planner(
    description=f"""\
Price the per-rank dispatch cap ({RULES.cap_env_var}) in FlashInfer
MoE all-to-all workspace bytes, byte-exact for every flashinfer release that has the A2A.

{ALLOCATIONS.MODES_HELP}""",
    options=(
        PlanOption("--payload-format", "payload_format", "dispatch payload: bf16, fp16, fp8, nvfp4, mxfp8, mxfp4, "
                   "deepseek-fp8 (default bf16)", "FORMAT"),
        PlanOption("--eplb-stats-experts", "eplb_stats_experts", "experts in FlashInfer's EPLB stats region (0.6.16+; "
                   "0..num_experts; default 0)", "S"),
        PlanOption("--flashinfer-version", "flashinfer_version", "flashinfer-python release (default 0.7.2.post1, "
                   "the newest with MoeAlltoAll; 0.7.4 sizes NVLinkOneSidedAlltoAll)", "X.Y.Z"),
        PlanOption("--mode", "mode", ALLOCATIONS.MODE_OPTION_HELP, "MODE"),
        PlanOption("--draft", "draft", ALLOCATIONS.DRAFT_OPTION_HELP),
        PlanOption("--cft", "cft", "0.7.4 only: size CFT's combine receive inbox and counters, as a run whose every "
                   "rank supports CFT builds them (default: off)"),
        PlanOption("--lamport-tokens", "lamport_tokens", "0.7.4 only: Lamport transport token limit the run settles "
                   f"on (0..{LAMPORT_MAX_TOKENS_PER_RANK}; default 0 = off)", "T"),
    ),
    group_title=None, ep_size_limit=f"1..{MAX_EP_SIZE}; 256 on 0.7.4", top_k_needed=True,
    bytes_field="workspace_bytes_per_rank", prepare=_plan_options, plan_at=ALLOCATIONS.plan_workspace,
    largest_within=ALLOCATIONS.largest_plan_within, table=_plan_table)


def _settings_pricing(params, geometry: ModelGeometry, ep_size: int, alignment: int) -> tuple[WorkspacePricing, bool]:
    """The workspace the engine's FlashInfer dispatcher allocates per cap (bf16, from the geometry alone); its
    prefill batches meet the cap."""
    return WorkspacePricing(ep_size, dispatch_bytes_per_token(geometry.hidden_size, geometry.top_k),
                            combine_bytes_per_token(geometry.hidden_size)), True


SPEC = BackendSpec(
    rules=RULES, params=FlashInferParams, refusal=_refusal, group_refusal=_group_refusal,
    pricing=WorkspacePricing.of_config, sizes=_sizes,
    prefill_dispatched=lambda params: True,  # the engine's floor rule counts its prefill batches
    # On moe_a2a_info and their own gauge, as before the registry (dashboards and alerts read them).
    series=BackendSeries(
        info_help=None, info_labels=("payload_format", "flashinfer_version"),
        gauges=(GaugeSeries("eplb_stats_num_experts", "Experts the workspace keeps EPLB load counters for (0: none); "
                            "part of the workspace size.", "experts", metric="moe_a2a_eplb_stats_experts"),
                GaugeSeries("cft", "FlashInfer 0.7.4: 1 where the built workspace has CFT's combine receive inbox and "
                            "counters (every rank supports CFT), else 0; part of the workspace size.", ""),
                GaugeSeries("lamport_max_tokens", "FlashInfer 0.7.4: the built object's Lamport transport token limit "
                            "(0: off); its regions are part of the workspace size.", "tokens"),
                GaugeSeries("built_workspace_bytes", "FlashInfer 0.7.4: the built object's own workspace bytes per "
                            "rank at its cap (metainfo WORKSPACE_SIZE; absent where not built or not reported).",
                            "bytes"))),
    planner=PLANNER,
    settings_pricing=_settings_pricing,
    params_formerly_top_level=True,
    max_top_k=max(release.max_top_k for release in _RELEASES),  # kMaxTopK
    max_ep_size=max(release.max_ep_size for release in _RELEASES),
    default_max_ep_size=FlashInferVersion.parse(None).max_ep_size,  # the default release's
    traffic_sample="the step leader's layer and every 16th after it",
    example_server_args=("--moe-runner-backend", "flashinfer_cutlass"),
    overflow_assertion_prefix="FlashInfer A2A runtime token geometry exceeds its fixed workspace: ",
)
