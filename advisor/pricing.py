"""What a group's A2A memory costs per rank at any cap, by its backend's pricing: FlashInfer's workspace
(``WorkspacePricing``, over ``capwatch.sizing.plan.plan_workspace``, which knows every FlashInfer layout) or
DeepEP's buffer (``capwatch.sizing.deepep_plan.DeepEPPricing``). ``pricing_of`` picks a rank's."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from capwatch.sizing.backends import DEEPEP
from capwatch.sizing.checks import SizingError
from capwatch.sizing.deepep_plan import DeepEPPricing
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.model_presets import ModelGeometry, custom_geometry
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


# What every pricing answers: ep_size, bytes_per_rank(cap), known_bytes_per_rank(cap).
Pricing = WorkspacePricing | DeepEPPricing


def pricing_of(config, ep_size: int) -> Pricing:
    """The pricing of a rank's config (a ``RankConfig``, or a source's ``UnpricedConfig``) in a group of
    ``ep_size`` ranks, by its backend."""
    if config.a2a_backend == DEEPEP.name:
        return DeepEPPricing.of_config(config, ep_size)
    return WorkspacePricing.of_config(config, ep_size)


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
