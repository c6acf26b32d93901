"""DeepEP's low-latency buffer as a backend (``--moe-a2a-backend deepep``): its parameters on the wire
(``DeepEPBuffer``, ``RankConfig.deepep``), priced by ``capwatch.sizing.deepep_plan.DeepEPPricing``, exported
as the ``moe_a2a_deepep_*`` series."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from capwatch.backends.spec import BackendSeries, BackendSpec, Config, GaugeSeries, RankSizes
from capwatch.sizing.checks import MAX_NUM_EXPERTS, SizingError
from capwatch.sizing.deepep_low_latency import check_dispatch_cap, check_low_latency_hidden_size, low_latency_layout
from capwatch.sizing.deepep_plan import DEEPEP, DEEPEP_MODES, DeepEPPricing, check_buffer_experts, prefill_dispatched
from capwatch.sizing.model_presets import ModelGeometry
from pydantic import BaseModel, ConfigDict, Field, model_validator

DeepEPMode = Literal[DEEPEP_MODES]  # type: ignore[valid-type]


class DeepEPBuffer(BaseModel):
    """How SGLang sized this rank's DeepEP buffer beyond the cap and the hidden size (``sizing/deepep_plan.py``):
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
    if config.payload_format != "bf16" or config.flashinfer_version is not None or config.eplb_stats_num_experts:
        return ("payload_format, flashinfer_version and eplb_stats_num_experts are FlashInfer's: DeepEP's buffer is "
                "sized for bf16 whatever the dispatch dtype (leave them at bf16, None and 0)")
    if config.deepep.buffer_experts < config.num_experts:
        return (f"buffer_experts {config.deepep.buffer_experts} is below num_experts {config.num_experts}: DeepEP gets "
                "the routed experts plus redundant and fused shared ones")
    try:
        check_dispatch_cap(config.cap)
        check_low_latency_hidden_size(config.hidden_size)
    except SizingError as error:
        return str(error)
    return None


def _group_refusal(config: Config, ep_size: int) -> str | None:
    try:
        check_buffer_experts(config.deepep.buffer_experts, ep_size)
        DeepEPPricing.of_config(config, ep_size).bytes_per_rank(config.cap)
    except SizingError as error:
        return str(error)
    return None


def _sizes(cap: int, ep_size: int, geometry: ModelGeometry, fields: Mapping[str, Any]) -> RankSizes:
    buffer = fields.get(DEEPEP.name)
    if buffer is None:
        raise SizingError("a deepep rank's config needs its deepep buffer (mode, buffer_experts)")
    check_buffer_experts(buffer.buffer_experts, ep_size)
    layout = low_latency_layout(cap, geometry.hidden_size, buffer.buffer_experts)
    return RankSizes(layout.dispatch_message_bytes, layout.combine_message_bytes,
                     DeepEPPricing.of_buffer(ep_size, geometry.hidden_size, buffer).bytes_per_rank(cap))


SPEC = BackendSpec(
    rules=DEEPEP, params=DeepEPBuffer, refusal=_refusal, group_refusal=_group_refusal,
    pricing=DeepEPPricing.of_config, sizes=_sizes,
    # Only in --deepep-mode low_latency: auto sends prefill to normal mode, which has no cap.
    prefill_dispatched=lambda buffer: buffer is None or prefill_dispatched(buffer.mode),
    series=BackendSeries(
        info_help="How SGLang sized this rank's DeepEP buffer: its --deepep-mode (value is always 1; present only "
                  "on DeepEP ranks).",
        info_labels=("mode",),
        gauges=(
            GaugeSeries("buffer_experts", "Experts DeepEP's low-latency buffer is sized for: routed + redundant + "
                        "fused shared-expert slots.", "experts"),
            GaugeSeries("normal_nvl_bytes", "Normal mode's NVLink buffer in this rank's DeepEP buffer (--deepep-mode "
                        "auto; 0 in low_latency): does not depend on the cap.", "bytes"),
            GaugeSeries("normal_rdma_bytes", "Normal mode's RDMA size hint (--deepep-mode auto): the RDMA buffer is "
                        "the larger of it and the low-latency size at the cap.", "bytes"),
        )),
)
