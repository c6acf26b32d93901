"""Whether a price in bytes is exact or an estimate, and from what: what a pricing says of one cap so that the advice
never states an estimate as a fact (docs/advisor.md, "Exact or estimated").

A reported-bytes buffer (``reported.py``) is exact at the cap a rank reported it for and priced in proportion
elsewhere; FlashInfer 0.7.4 as built prices the Lamport regions above a clamped limit at the limit built (a lower
bound). A pricing that knows such a case answers ``basis_at(cap)``; any other is exact wherever it prices
(``capwatch.backends.spec.price_basis``).
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.byte_units import format_gib


@dataclass(frozen=True)
class PriceBasis:
    """How one cap's bytes are known: ``exact``, or not, with ``words`` saying how they were made and
    ``reported_cap`` / ``reported_bytes_per_rank`` the figure a rank reported that they were made from (None:
    exact, or made from nothing reported)."""

    exact: bool
    words: str = "exact"
    reported_cap: int | None = None
    reported_bytes_per_rank: int | None = None

    @classmethod
    def in_proportion(cls, reported_cap: int, reported_bytes_per_rank: int) -> PriceBasis:
        """An estimate in proportion to the bytes a rank reported at another cap."""
        return cls(False, f"estimated in proportion to the {format_gib(reported_bytes_per_rank)} per rank reported "
                          f"at cap {reported_cap}, exact only there", reported_cap, reported_bytes_per_rank)


EXACT = PriceBasis(exact=True)
ESTIMATED = PriceBasis(exact=False, words="estimated")
