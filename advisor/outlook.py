"""What one cap would cost and risk against the cap in use: its memory (per rank, across the group, the change),
the KV-cache tokens that change frees or costs (``kv.py``), and its predicted overflows (the history's share of
windows above it; the tail model's windows per day and their band, ``tail.py``). One computation for the advice's
recommended cap (its price and forecast) and every cap a what-if asks about, so the what-if curve passes through
the advice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from capwatch.advisor.kv import kv_tokens
from capwatch.advisor.pricing import PriceBasis, price_basis

if TYPE_CHECKING:
    from capwatch.advisor.evidence import Evidence


@dataclass(frozen=True)
class Outlook:
    cap: int
    bytes_per_rank: int
    bytes_group: int
    bytes_group_delta: int  # against the cap in use, across the group
    kv_cache_tokens_per_rank_freed: int | None  # < 0: the cap costs KV room; None: the model's KV size is unknown
    # None without samples (no history to predict from)
    overflow_rate: float | None
    overflow_windows_per_day: float | None
    overflow_windows_per_day_low: float | None
    overflow_windows_per_day_high: float | None
    # How its bytes are known: exact, or an estimate (a reported-bytes buffer away from the cap it was reported at)
    basis: PriceBasis | None = None


def outlook(given: Evidence, cap: int) -> Outlook:
    history, pricing = given.history, given.group.pricing
    per_rank, current_bytes = pricing.bytes_per_rank(cap), given.current_bytes_per_rank
    if history.sample_count:
        model = given.tail
        low, high = model.band(cap)
        overflows = (history.usage.share_above(cap), rounded(model.overflow_windows_per_day(cap)), rounded(low),
                     rounded(high))
    else:
        overflows = (None, None, None, None)
    return Outlook(cap, per_rank, per_rank * pricing.ep_size, (per_rank - current_bytes) * pricing.ep_size,
                   kv_tokens(current_bytes - per_rank, given.group.kv_bytes_per_token), *overflows,
                   basis=price_basis(pricing, cap))


def rounded(value: float) -> float:
    """4 significant digits: a prediction is not more precise, and a folded history then gives the same advice."""
    return float(f"{value:.4g}")
