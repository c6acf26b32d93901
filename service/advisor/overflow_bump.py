"""Overflow events: evidence that the need was ABOVE what was observed.

Like VPA's OOM bump, an overflowing window adds one extra sample at
``max(used * factor, used + min_tokens)`` with ``used = max(cap, observed peak)``. It is
computed from what was used, never from an earlier bump, so bumps do not compound.
"""

from __future__ import annotations


def overflow_bump(peak_runtime_tokens: int, cap: int, factor: float = 1.2, min_tokens: int = 16) -> int:
    used = max(cap, peak_runtime_tokens)
    return max(int(-(-used * factor // 1)), used + min_tokens)
