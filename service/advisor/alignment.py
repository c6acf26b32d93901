"""Caps are set in multiples of an alignment (128 by default, as SGLang's planner and DeepEP's tiers do)."""

from __future__ import annotations


def align_up(tokens: float, alignment: int) -> int:
    return max(alignment, int(-(-tokens // alignment)) * alignment)


def align_down(tokens: float, alignment: int) -> int:
    return int(tokens // alignment) * alignment
