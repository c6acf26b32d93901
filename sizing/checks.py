"""Input checks every sizing module applies, and the bounds of a real deployment.

A ``SizingError`` says what FlashInfer (or DeepEP, or SGLang) would refuse, or what cannot describe
a real deployment; every caller turns it into one clear line.
"""

from __future__ import annotations

INT32_MAX = (1 << 31) - 1  # FlashInfer casts max_num_tokens to int
# Bounds on a model no real deployment exceeds (the largest MoE models have hidden sizes of 7-16 K and
# a few hundred experts); past them an input is a typo, and pricing it would be wasted work.
MAX_HIDDEN_SIZE = 1 << 16
MAX_NUM_EXPERTS = 1 << 12


class SizingError(ValueError):
    """Input that FlashInfer would reject, or that cannot describe a real deployment."""


def check_integer(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizingError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        qualifier = "positive" if minimum == 1 else f">= {minimum}"
        raise SizingError(f"{name} must be {qualifier}, got {value}")
    return value


def check_positive(name: str, value: int) -> int:
    return check_integer(name, value, 1)
