"""The budget stage: the A2A memory budget per rank (``CAPWATCH_ADVISOR__BUDGET_BYTES_PER_RANK``: FlashInfer's
workspace, DeepEP's buffer) lowers the cap to the largest whose memory fits it, but never below SGLang's floor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capwatch.advisor.pricing import Pricing
from capwatch.advisor.stage import Step
from capwatch.sizing.byte_units import format_gib
from capwatch.sizing.caps import align_up, largest_aligned_cap

if TYPE_CHECKING:  # evidence.py measures with largest_cap_within() below
    from capwatch.advisor.evidence import Evidence


def largest_cap_within(budget_bytes_per_rank: int, pricing: Pricing, alignment: int, max_cap: int) -> int | None:
    """Largest multiple of ``alignment`` (at most ``max_cap``: at most the backend's own limit, which its pricing
    refuses beyond, e.g. DeepEP's 1024) whose memory fits the budget, None if even one step does not. Every
    pricing prices any cap within that limit (FlashInfer's with the planner's own ``plan_workspace``, DeepEP's
    with its buffer layout), so one search serves both."""
    return largest_aligned_cap(lambda cap: pricing.bytes_per_rank(cap) <= budget_bytes_per_rank, alignment, max_cap)


def clamp_to_budget(given: Evidence, sized: float) -> Step[float]:
    """Below the floor SGLang refuses to start (and a CUDA graph's batch would overflow at capture), so a
    budget that cannot hold the floor is reported and the floor wins."""
    tokens, budget_cap, floor_cap, policy = int(sized), given.budget_cap, given.floor_cap, given.policy
    if policy.budget_bytes_per_rank is not None and budget_cap is None:
        # No cap fits at all (as `capwatch plan --budget` says it): never dropped silently.
        smallest = policy.alignment
        return Step(tokens, (
            f"no cap fits the memory budget of {policy.budget_bytes_per_rank:,} bytes per rank "
            f"(CAPWATCH_ADVISOR__BUDGET_BYTES_PER_RANK): the smallest aligned cap, {smallest}, already needs "
            f"{given.group.pricing.bytes_per_rank(smallest):,} bytes of {given.rules.memory}; this advice is sized "
            "without the budget: raise the budget",))
    if budget_cap is None or tokens <= budget_cap:
        return Step(tokens)
    budget = format_gib(policy.budget_bytes_per_rank)
    if floor_cap is not None and budget_cap < floor_cap:
        return Step(min(tokens, align_up(floor_cap, policy.alignment)), (
            f"the memory budget of {budget} per rank allows at most {budget_cap} tokens, below the floor "
            f"{floor_cap} ({given.floor.why}): the floor wins; raise the budget or lower the floor's "
            "inputs (prefill chunk, CUDA-graph batch sizes)",))
    return Step(budget_cap, (f"clamped to {budget_cap}, the largest cap whose {given.rules.memory} fits the budget "
                             f"of {budget} per rank (the estimate wanted {tokens})",))
