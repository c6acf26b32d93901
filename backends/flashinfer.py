"""FlashInfer's MoE A2A as a backend (``--moe-a2a-backend flashinfer``): its workspace priced by
``capwatch.sizing.plan.plan_workspace`` (every layout), its parameters the config's shared fields
(``payload_format``, ``flashinfer_version``, ``eplb_stats_num_experts``: the wire's first backend)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capwatch.backends.spec import BackendSpec, Config, RankSizes
from capwatch.sizing.checks import SizingError
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.flashinfer_releases import FLASHINFER, FlashInferVersion, check_routing
from capwatch.sizing.model_presets import ModelGeometry, custom_geometry
from capwatch.sizing.payloads import hidden_bytes_per_token
from capwatch.sizing.plan import WorkspacePlan, plan_workspace


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

    @classmethod
    def of_config(cls, config, ep_size: int) -> "WorkspacePricing":
        """The pricing of a rank's config (a ``RankConfig``, or a source's ``UnpricedConfig``) in a group of
        ``ep_size`` ranks."""
        geometry = (custom_geometry(config.hidden_size, config.top_k, config.num_experts)
                    if config.hidden_size is not None else None)  # a source that cannot see it
        return cls(ep_size, config.dispatch_bytes_per_token, config.combine_bytes_per_token,
                   config.eplb_stats_num_experts, config.flashinfer_version, geometry, config.payload_format)

    def plan(self, cap: int) -> WorkspacePlan:
        if self.geometry is None:
            raise SizingError("pricing without the model geometry knows only the moe_a2a layout")
        return plan_workspace(self.geometry, self.ep_size, cap, self.payload_format, self.eplb_stats_num_experts,
                              self.flashinfer_version,
                              bytes_per_token=(self.dispatch_bytes_per_token, self.combine_bytes_per_token))

    def bytes_per_rank(self, cap: int) -> int:
        return _bytes_per_rank(self, cap)

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
    if pricing.geometry is None:  # moe_a2a's own inputs: the bytes per token
        return workspace_bytes_per_rank(
            pricing.ep_size, cap, pricing.dispatch_bytes_per_token, pricing.combine_bytes_per_token,
            pricing.eplb_stats_num_experts, pricing.flashinfer_version)
    return pricing.plan(cap).workspace_bytes_per_rank


def _refusal(config: Config) -> str | None:
    return _routing_refusal(config.top_k, config.num_experts, config.hidden_size, config.payload_format,
                            config.flashinfer_version)


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
    try:
        plan_workspace(custom_geometry(config.hidden_size, config.top_k, config.num_experts), ep_size, config.cap,
                       config.payload_format, config.eplb_stats_num_experts, config.flashinfer_version,
                       bytes_per_token=(config.dispatch_bytes_per_token, config.combine_bytes_per_token))
    except SizingError as error:
        return str(error)
    return None


def _sizes(cap: int, ep_size: int, geometry: ModelGeometry, fields: Mapping[str, Any]) -> RankSizes:
    plan = plan_workspace(geometry, ep_size, cap, fields.get("payload_format", "bf16"),
                          fields.get("eplb_stats_num_experts", 0), fields.get("flashinfer_version"))
    return RankSizes(plan.dispatch_bytes_per_token, plan.combine_bytes_per_token, plan.workspace_bytes_per_rank)


SPEC = BackendSpec(
    rules=FLASHINFER, params=None, refusal=_refusal, group_refusal=_group_refusal,
    pricing=WorkspacePricing.of_config, sizes=_sizes,
    prefill_dispatched=lambda params: True,  # SGLang's floor rule counts its prefill batches
)
