"""What a group's A2A memory costs per rank at any cap, by its backend's pricing (``capwatch.backends``: each
backend's spec prices its own; ``pricing_of`` picks a rank's)."""

from __future__ import annotations

from capwatch.backends import Pricing, pricing_of

__all__ = ["Pricing", "pricing_of"]
