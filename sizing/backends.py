"""The A2A backends capwatch knows, each with the rules of its per-rank cap: the variable SGLang reads
the cap from, and the alignment and range capwatch advises within.

One entry per backend, keyed by the name SGLang's ``--moe-a2a-backend`` gives it. A new backend is
one more entry here (its workspace layout is one more module beside ``flashinfer_moe_a2a``), and
every part that names a cap's variable or bounds a cap takes it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.caps import CAP_ALIGNMENT, MAX_CAP_TOKENS
from capwatch.sizing.checks import SizingError


@dataclass(frozen=True)
class BackendCapRules:
    name: str  # as SGLang's --moe-a2a-backend spells it
    cap_env_var: str  # where SGLang reads the per-rank cap from
    alignment: int = CAP_ALIGNMENT  # caps capwatch suggests are multiples of this
    max_cap_tokens: int = MAX_CAP_TOKENS  # the largest cap the backend accepts

    def check_cap(self, cap: int) -> None:
        """SizingError unless ``cap`` is within 1..max_cap_tokens: no part sizes, advises or asks about another."""
        if not 1 <= cap <= self.max_cap_tokens:
            raise SizingError(f"cap {cap} is outside 1..{self.max_cap_tokens} tokens per rank, the range capwatch "
                              f"sizes for the {self.name} A2A")

    def env_line(self, cap: int) -> str:
        """``VAR=cap``: the line an operator exports."""
        return f"{self.cap_env_var}={cap}"


FLASHINFER = BackendCapRules("flashinfer", "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK")

BACKENDS: dict[str, BackendCapRules] = {rules.name: rules for rules in (FLASHINFER,)}


def backend_rules(name: str) -> BackendCapRules:
    """The rules of the backend SGLang calls ``name``; SizingError naming the known ones otherwise."""
    rules = BACKENDS.get(name)
    if rules is None:
        raise SizingError(f"capwatch does not size the {name!r} A2A backend; it knows {', '.join(sorted(BACKENDS))}")
    return rules
