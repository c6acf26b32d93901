"""The per-rank cap itself: the alignment capwatch suggests, the range every part accepts, and the one
rounding to that alignment. Each backend's own variable and bounds: ``backends.py``."""

from __future__ import annotations

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
