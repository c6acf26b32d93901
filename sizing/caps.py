"""The per-rank cap itself: the alignment capwatch suggests, the range every part accepts, and the one
rounding to that alignment. Each backend's own variable and bounds: ``backends.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from capwatch.sizing.checks import SizingError, check_positive

# Caps capwatch suggests are multiples of this many tokens.
CAP_ALIGNMENT = 128
# The largest cap any part accepts (the report schema, the CLI): beyond it is a typo or an attack.
MAX_CAP_TOKENS = 1 << 20


def align_up(value: int | float, alignment: int = CAP_ALIGNMENT) -> int:
    """The smallest multiple of ``alignment`` at or above ``value`` (0 stays 0): the one align-up
    for token caps and byte offsets alike."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    return int(-(-value // alignment)) * alignment


def align_down(value: int | float, alignment: int = CAP_ALIGNMENT) -> int:
    """The largest multiple of ``alignment`` at or below ``value``."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    return int(value // alignment) * alignment


def largest_aligned_cap(fits: Callable[[int], bool], alignment: int, max_cap: int) -> int | None:
    """The largest multiple of ``alignment`` at most ``max_cap`` for which ``fits(cap)`` holds; None if not
    even ``alignment`` does (or it is above ``max_cap``). ``fits`` must be monotone, true up to some cap and
    false above it, as a budget is for memory that grows with the cap: the one search behind every "largest
    cap within a budget" (FlashInfer's workspace, DeepEP's buffer, any pricing). It gallops (1, 2, 4, ...
    steps of ``alignment``) and then bisects: about 2 log2(answer / alignment) calls, few for the small caps
    budgets allow in a range as wide as ``MAX_CAP_TOKENS``."""
    check_positive("alignment", alignment)  # the one check of its callers' alignment (a SizingError)
    max_units = max_cap // alignment
    if max_units < 1 or not fits(alignment):
        return None
    fitting, above = 1, max_units + 1  # in steps of alignment: `fitting` fits, `above` does not (or is past max)
    units = 2
    while units <= max_units:
        if not fits(units * alignment):
            above = units
            break
        fitting, units = units, units * 2
    while above - fitting > 1:
        middle = (fitting + above) // 2
        if fits(middle * alignment):
            fitting = middle
        else:
            above = middle
    return fitting * alignment


class PricedByFormula:
    """What a pricing whose ``bytes_per_rank(cap)`` is exact wherever it prices (the library's own arithmetic) derives
    from it, written once: the bytes or None, and the largest cap within a budget, up to ``MAX_CAP`` (the backend's
    largest cap)."""

    MAX_CAP: ClassVar[int] = MAX_CAP_TOKENS

    def bytes_per_rank(self, cap: int) -> int:
        raise NotImplementedError

    def known_bytes_per_rank(self, cap: int) -> int | None:
        """``bytes_per_rank``, or None where this configuration cannot be priced: a view then says nothing rather
        than guess."""
        try:
            return self.bytes_per_rank(cap)
        except SizingError:
            return None

    def largest_cap_within(self, budget_bytes_per_rank: int, alignment: int = CAP_ALIGNMENT,
                           max_cap: int | None = None) -> int | None:
        """The largest multiple of ``alignment`` up to ``max_cap`` (and ``MAX_CAP``) whose bytes fit; None if none
        (the bytes grow with the cap)."""
        limit = self.MAX_CAP if max_cap is None else min(max_cap, self.MAX_CAP)
        return largest_aligned_cap(lambda cap: self.bytes_per_rank(cap) <= budget_bytes_per_rank, alignment, limit)
