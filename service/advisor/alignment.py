"""The alignment stage: a cap is a multiple of the policy's alignment (``CAP_ALIGNMENT``, 128), rounded up —
never down, which would undercut the peaks — within [min_cap, the ceiling] (the rounding: ``sizing/caps.py``).

The ceiling is the one range every cap the advisor produces lies in: the policy's ``max_cap``, raised to SGLang's
start-up floor (a cap below it is one the server refuses to start with), and never above the largest cap the
group's A2A backend takes (``sizing/backends.py``). A floor above that leaves no cap that both starts the server
and fits the backend: the group cannot be advised, and says why (a ``SizingError``, answered 409)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capwatch.service.advisor.stage import Step
from capwatch.sizing.caps import align_down, align_up
from capwatch.sizing.checks import SizingError

if TYPE_CHECKING:
    from capwatch.service.advisor.evidence import Evidence


def cap_ceiling(given: Evidence) -> int:
    """The largest cap the advisor may produce for this group (see the module's docstring)."""
    policy, floor, rules = given.policy, given.floor, given.group.cap_rules
    if floor is not None and floor.tokens > rules.max_cap_tokens:
        raise SizingError(f"the floor is {floor.tokens} tokens ({floor.binds}; {floor.why}), above "
                          f"{rules.max_cap_tokens}, the largest cap the {rules.name} A2A takes: no cap both starts "
                          "these ranks and fits; check their CUDA-graph batch sizes and speculative tokens")
    wanted = max(align_down(policy.max_cap, policy.alignment), align_up(floor.tokens, policy.alignment) if floor else 0)
    return min(wanted, rules.max_cap_tokens)


def align(given: Evidence, sized: float) -> Step[float]:
    """The floor outranks max_cap: a cap below it is one the server refuses to start with."""
    policy = given.policy
    return Step(min(align_up(max(sized, policy.min_cap), policy.alignment), given.cap_ceiling))
