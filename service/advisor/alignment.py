"""Caps are set in multiples of an alignment (128 by default, as SGLang's planner and DeepEP's tiers do)."""

from __future__ import annotations

from capwatch.service.advisor.stage import Stage


def align_up(tokens: float, alignment: int) -> int:
    return max(alignment, int(-(-tokens // alignment)) * alignment)


def align_down(tokens: float, alignment: int) -> int:
    return int(tokens // alignment) * alignment


def align(tokens: float, min_cap: int, max_cap: int, alignment: int) -> Stage:
    """A cap is a multiple of the alignment within [min_cap, max_cap], rounded up (never down)."""
    return Stage("alignment", min(align_up(max(tokens, min_cap), alignment), align_down(max_cap, alignment)))
