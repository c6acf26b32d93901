"""Byte counts as people write them ("2GiB", "512 MiB", "1.5GB", "4096") and back."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from capwatch.sizing.checks import SizingError

BYTE_UNITS: dict[str, int] = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_PATTERN = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")


def parse_byte_size(text: str) -> int:
    """``"2GiB"`` -> 2147483648. Binary (KiB/MiB/GiB/TiB) and decimal (KB/MB/GB/TB) units, or bytes."""
    match = _PATTERN.fullmatch(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in BYTE_UNITS:
        raise SizingError(
            f"cannot read {text!r} as a size; write a number with an optional unit "
            "(bytes, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 2GiB or 500MB"
        )
    try:
        value = int(Decimal(match.group(1)) * BYTE_UNITS[unit])
    except InvalidOperation as error:  # pragma: no cover - the pattern only admits decimals
        raise SizingError(f"cannot read {text!r} as a size") from error
    if value <= 0:
        raise SizingError(f"size {text!r} must be at least one byte")
    return value


def format_bytes(count: int) -> str:
    """Binary units, two decimals: 235585920 -> '224.67 MiB'."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(count) >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"


def format_gib(count: int, digits: int = 2) -> str:
    """Fixed GiB, as workspace sizes are compared side by side: 471859200 -> '0.44 GiB'. The one
    GiB format of the CLI, the advice's reasons and the findings."""
    return f"{count / BYTE_UNITS['gib']:.{digits}f} GiB"
