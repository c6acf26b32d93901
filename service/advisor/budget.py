"""A per-rank memory budget for the A2A workspace, priced with FlashInfer's own sizing formula."""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.dispatcher.sizing import MAX_EP_SIZE, workspace_bytes_per_rank  # noqa: F401  (MAX_EP_SIZE re-exported for callers)


@dataclass(frozen=True)
class WorkspacePricing:
    """What one rank's workspace costs per cap (everything but the cap comes from the reports)."""

    ep_size: int
    dispatch_bytes_per_token: int
    combine_bytes_per_token: int
    eplb_stats_num_experts: int = 0
    flashinfer_version: str | None = None

    def bytes_per_rank(self, cap: int) -> int:
        return workspace_bytes_per_rank(
            self.ep_size, cap, self.dispatch_bytes_per_token, self.combine_bytes_per_token,
            self.eplb_stats_num_experts, self.flashinfer_version,
        )


def largest_cap_within(budget_bytes_per_rank: int, pricing: WorkspacePricing, alignment: int,
                       max_cap: int = 1 << 20) -> int | None:
    """Largest multiple of ``alignment`` whose workspace fits the budget (None if even one step does not).
    The workspace grows monotonically with the cap, so a binary search over steps finds it."""
    low, high = 0, max_cap // alignment  # in alignment steps; step 0 stands for "nothing fits"
    while low < high:
        middle = (low + high + 1) // 2
        if pricing.bytes_per_rank(middle * alignment) <= budget_bytes_per_rank:
            low = middle
        else:
            high = middle - 1
    return low * alignment if low else None
