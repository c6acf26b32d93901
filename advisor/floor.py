"""The smallest cap the deployment can run with, and which of its terms binds.

The engine's start-up floor (``sglang_engine/floor.py``: SGLang's terms and what happens below them), and for
ranks that report no engine limits their largest CUDA-graph decode batch x (1 + draft tokens): below it the
first full decode batch overflows. Advice below the floor cannot be followed. docs/advisor.md ("SGLang's floor").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from capwatch.advisor.stage import Step
from capwatch.backends import DEFAULT_BACKEND
from capwatch.engines import engine_of
from capwatch.sizing.backends import BackendCapRules

if TYPE_CHECKING:  # evidence.py measures with deployment_floor() below
    from capwatch.advisor.evidence import Evidence


@dataclass(frozen=True)
class Floor:
    tokens: int
    binds: str  # the term that sets it, in words
    why: str  # what happens below it


def deployment_floor(engine_limits, cuda_graph_max_batch_size: int | None,
                     speculative_tokens: int = 0, rules: BackendCapRules = DEFAULT_BACKEND.rules,
                     prefill_dispatched: bool = True) -> Floor | None:
    terms = []
    if engine_limits is not None:  # the engine's start-up floor (capwatch.engines)
        engine = engine_of(engine_limits)
        why = engine.floor_why(engine_limits, rules)
        terms = [(tokens, what, why) for tokens, what in engine.floor_terms(engine_limits, rules, prefill_dispatched)]
    if cuda_graph_max_batch_size is not None:
        terms.append((cuda_graph_max_batch_size * (1 + speculative_tokens),
                      f"the largest CUDA-graph decode batch {cuda_graph_max_batch_size} x "
                      f"(1 + {speculative_tokens} speculative tokens)", "a full decode batch overflows below it"))
    terms = [term for term in terms if term[0] > 0]
    if not terms:
        return None
    tokens, binds, why = max(terms, key=lambda term: term[0])  # ties: the engine's own rule, listed first
    return Floor(tokens, binds, why)


def raise_to_floor(given: Evidence, sized: float) -> Step[float]:
    """Never below the floor: the server would refuse to start, or a full CUDA-graph batch would overflow."""
    floor = given.floor
    if floor is None or sized >= floor.tokens:
        return Step(sized)
    return Step(floor.tokens, (f"raised to the floor {floor.tokens}: {floor.binds} ({floor.why})",))
