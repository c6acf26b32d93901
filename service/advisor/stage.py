"""One link of the advisor's chain: the value it hands on and, when it changed or decided something, why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    name: str
    tokens: float
    reasons: tuple[str, ...] = field(default=())


def pct(rate: float) -> str:
    return f"{rate:.2%}" if rate else "0%"
