"""The A2A workspace memory budget per rank (``CAPWATCH_ADVISOR__BUDGET_BYTES_PER_RANK``): the largest cap
whose workspace fits it."""

from __future__ import annotations

from capwatch.service.advisor.pricing import WorkspacePricing
from capwatch.sizing.plan import NoCapFits, largest_plan_within


def largest_cap_within(budget_bytes_per_rank: int, pricing: WorkspacePricing, alignment: int,
                       max_cap: int = 1 << 20) -> int | None:
    """Largest multiple of ``alignment`` (at most ``max_cap``) whose workspace fits the budget, None if
    even one step does not: the planner's own search when the geometry is known."""
    if pricing.geometry is not None:
        try:
            return largest_plan_within(
                budget_bytes_per_rank, pricing.geometry, pricing.ep_size, pricing.payload_format,
                pricing.eplb_stats_num_experts, pricing.flashinfer_version, alignment=alignment, max_cap=max_cap,
                bytes_per_token=(pricing.dispatch_bytes_per_token, pricing.combine_bytes_per_token)).cap
        except NoCapFits:
            return None
    low, high = 0, max_cap // alignment  # in alignment steps; step 0 stands for "nothing fits"
    while low < high:
        middle = (low + high + 1) // 2
        if pricing.bytes_per_rank(middle * alignment) <= budget_bytes_per_rank:
            low = middle
        else:
            high = middle - 1
    return low * alignment if low else None
