"""The one interface of every stage of the advisor's chain (VPA's composable estimators):

    stage(given: Evidence, sized: float) -> Step

a small pure function of the same typed input — what is known and measured about the group (``Evidence``) and
the tokens the stage before it sized for — that returns its value and, when it changed or decided something,
why. The sizing stages hand on tokens; the last one, ``hysteresis.decide``, hands on the advice's ``Decision``.
``recommend.py`` composes them in one visible chain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:  # evidence.py measures with the stages' own modules, which import this one
    from capwatch.advisor.evidence import Evidence

Value = TypeVar("Value")


@dataclass(frozen=True)
class Step(Generic[Value]):
    """What one stage hands on: its value, and why (nothing when it has nothing to say)."""

    value: Value
    reasons: tuple[str, ...] = field(default=())


Stage = Callable[["Evidence", float], Step[Value]]


def pct(rate: float) -> str:
    return f"{rate:.2%}" if rate else "0%"


def duration(seconds: float) -> str:
    """A span of history in the unit that reads: 40 s, 25 min, 3.0 h, 2.5 days."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"
