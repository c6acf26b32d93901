"""A backend whose buffer capwatch prices from the bytes a rank reported (``sizing/reported.py``): one spec built
from the backend's rules and its payload, the same for every such backend (DeepEP v2, pplx, NIXL EP, Mooncake EP).

Its parameters on the wire (``ReportedBuffer``, ``RankConfig.<backend>``): the bytes the rank's buffer holds at
its cap, and its dispatch format. ``capwatch plan`` takes them as options (what a rank reported or the engine
logged); the log reader has no bytes to price from and says so."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    fits_cell,
    fits_header,
)
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.byte_units import format_bytes
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import ModelGeometry
from capwatch.sizing.payloads import combine_bytes_per_token, hidden_bytes_per_token
from capwatch.sizing.reported import (
    MAX_BUFFER_BYTES,
    ReportedPlan,
    ReportedPricing,
    largest_reported_within,
    plan_reported,
)
from pydantic import BaseModel, ConfigDict, Field

DispatchFormat = Literal["bf16", "fp8"]


class ReportedBuffer(BaseModel):
    """A rank's buffer as it reported it: its bytes at the rank's cap, and the format its tokens are dispatched in
    (what the payload per token depends on)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    buffer_bytes: Annotated[int, Field(ge=1, le=MAX_BUFFER_BYTES)]
    dispatch_format: DispatchFormat = "bf16"


# The dispatch formats as the payload table names them (fp8: e4m3 with one fp32 scale per 128 channels).
PAYLOAD_OF_FORMAT = {"bf16": "bf16", "fp8": "deepseek-fp8"}


def reported_spec(rules: BackendCapRules, description: str, prefill_dispatched: bool = True,
                  check_hidden_size: Callable[[int], int] = lambda hidden_size: hidden_size) -> BackendSpec:
    """The spec of a backend whose buffer a rank reports. ``description``: its paragraph of ``capwatch plan
    --help`` (what the buffer is, where its bytes come from); ``prefill_dispatched``: whether prefill batches
    go through its cap; ``check_hidden_size``: SizingError for a model the backend refuses."""
    name = rules.name
    flag = name.replace("_", "-")

    def pricing(config: Config, ep_size: int) -> ReportedPricing:
        """A rank's config (a ``RankConfig``, or a source's ``UnpricedConfig``): its reported bytes at its cap, or
        nothing where either is unknown."""
        buffer, cap = getattr(config, name, None), getattr(config, "cap", None)
        if buffer is None or cap is None:
            return ReportedPricing(ep_size, None, None)
        return ReportedPricing(ep_size, cap, buffer.buffer_bytes)

    def refusal(config: Config) -> str | None:
        buffer = getattr(config, name, None)
        if buffer is None:
            return f"a {name} rank's config needs its {name} buffer (buffer_bytes, dispatch_format)"
        try:
            rules.check_cap(config.cap)
            check_hidden_size(config.hidden_size)
        except SizingError as error:
            return str(error)
        return None

    def sizes(cap: int, ep_size: int, geometry: ModelGeometry, buffer: ReportedBuffer | None) -> RankSizes:
        if buffer is None:
            raise SizingError(f"a {name} rank's config needs its {name} buffer (buffer_bytes, dispatch_format)")
        rules.check_cap(cap)
        hidden = check_hidden_size(geometry.hidden_size)
        return RankSizes(hidden_bytes_per_token(hidden, PAYLOAD_OF_FORMAT[buffer.dispatch_format]),
                         combine_bytes_per_token(hidden), buffer.buffer_bytes)

    def prepare(values: Mapping[str, Any], geometry: ModelGeometry, ep_size: int, integer) -> dict:
        given = {key: values[f"{name}_{key}"] for key in ("buffer_bytes", "buffer_cap")}
        if None in given.values():
            raise SizingError(f"capwatch cannot size the {name} buffer offline (its library computes it at run "
                              f"time): give --{flag}-buffer-bytes B and --{flag}-buffer-cap T, the bytes a rank "
                              "reported (moe_a2a_workspace_allocated_bytes) or the engine logged, at the cap it had")
        return dict(ep_size=ep_size, max_cap=rules.max_cap_tokens,
                    buffer_bytes=integer(f"--{flag}-buffer-bytes", given["buffer_bytes"], 1),
                    buffer_cap=integer(f"--{flag}-buffer-cap", given["buffer_cap"], 1))

    def table(plans: list[ReportedPlan], geometry: ModelGeometry, budget: int | None,
              caption: str | None) -> PlanTable:
        first = plans[0]
        title = (f"{geometry.name}: H={geometry.hidden_size} | ep_size={first.ep_size}, {name} buffer of "
                 f"{format_bytes(first.buffer_bytes_reported)} reported at cap {first.buffer_cap}")
        headers = ["cap/rank", "buffer/rank", "bytes/rank", "EP group", "priced"] + fits_header(budget)
        rows = [[f"{plan.cap:,}", format_bytes(plan.bytes_per_rank), f"{plan.bytes_per_rank:,}",
                 format_bytes(plan.bytes_group), "reported" if plan.exact else "in proportion"]
                + fits_cell(plan.bytes_per_rank, budget) for plan in plans]
        notes = (f"only cap {first.buffer_cap} is exact (the bytes reported); every other cap is priced in "
                 "proportion to it, an estimate",)
        return PlanTable(title, tuple(headers), rows, caption, notes)

    def settings_pricing(params, geometry: ModelGeometry, ep_size: int, alignment: int):
        raise SizingError(f"capwatch prices the {name} buffer from the bytes a rank reports (the plugin's reports "
                          "or series): a server's log has no size for it")

    planner = Planner(
        description=description, group_title=f"{name} (--backend {name})", ep_size_limit="", top_k_needed=False,
        options=(PlanOption(f"--{flag}-buffer-bytes", f"{name}_buffer_bytes",
                            "the bytes a rank's buffer reported (moe_a2a_workspace_allocated_bytes)", "B"),
                 PlanOption(f"--{flag}-buffer-cap", f"{name}_buffer_cap",
                            "the cap that buffer was built for", "T")),
        bytes_field="bytes_per_rank", prepare=prepare, plan_at=plan_reported, largest_within=largest_reported_within,
        table=table)
    return BackendSpec(
        rules=rules, params=ReportedBuffer, refusal=refusal,
        group_refusal=lambda config, ep_size: None, pricing=pricing, sizes=sizes,
        prefill_dispatched=lambda buffer: prefill_dispatched,
        series=BackendSeries(
            info_help=f"The format this rank's {name} dispatch sends tokens in (value is always 1; present only on "
                      f"{name} ranks).",
            info_labels=("dispatch_format",),
            gauges=(GaugeSeries("buffer_bytes", f"The bytes this rank's {name} buffer reported at its cap: exact "
                                "there, the price of every other cap in proportion.", "bytes"),)),
        planner=planner,
        settings_params=lambda settings: (),
        settings_pricing=settings_pricing,
        bytes_known="reported",
        traffic_copies=PAIRS,
        traffic_sample=LEADER_LAYER,
        traffic_received_sample=SENT_ONLY,
    )

