"""What a group's A2A memory costs per rank at any cap, by its backend's pricing (``capwatch.backends``: each
backend's spec prices its own; ``pricing_of`` picks a rank's), and whether that cost is exact at a cap or an
estimate (``price_basis``: a reported-bytes buffer away from the cap it was reported at)."""

from __future__ import annotations

from capwatch.backends import Pricing, pricing_of
from capwatch.backends.spec import price_basis
from capwatch.sizing.price_basis import PriceBasis

__all__ = ["Pricing", "PriceBasis", "price_basis", "pricing_of"]
