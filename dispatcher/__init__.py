"""capwatch's dispatcher layer: FlashInfer-semantics A2A backends, cap guards, device counters.

Importing the package loads nothing heavy: the names below resolve on first use (PEP 562), so
``dispatcher.sizing``, ``dispatcher.vocabulary``, ``dispatcher.models`` and
``dispatcher.workspace_plan`` stay torch-free. FlashInfer is imported lazily inside
``dispatcher.flashinfer_backend``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY_NAMES = {  # public name -> submodule that defines it
    "A2ABackend": "backend",
    "DispatchPairingError": "backend",
    "compute_target_rank_id": "backend",
    "local_expert_range": "backend",
    "CounterSnapshot": "counters",
    "DispatchCounters": "counters",
    "pause_snapshots": "counters",
    "CAP_ENV_VAR": "vocabulary",
    "CapOverflowError": "instrumented",
    "InstrumentedDispatcher": "instrumented",
    "OverflowEvent": "instrumented",
    "suggested_cap": "instrumented",
    "OVERFLOW_KINDS": "vocabulary",
    "OVERFLOW_OUTCOMES": "vocabulary",
    "ROLES": "vocabulary",
}

__all__ = sorted(_LAZY_NAMES)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ resolves these
    from .backend import A2ABackend, DispatchPairingError, compute_target_rank_id, local_expert_range
    from .counters import CounterSnapshot, DispatchCounters, pause_snapshots
    from .instrumented import CapOverflowError, InstrumentedDispatcher, OverflowEvent, suggested_cap
    from .vocabulary import CAP_ENV_VAR, OVERFLOW_KINDS, OVERFLOW_OUTCOMES, ROLES


def __getattr__(name: str) -> Any:
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dispatcher' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))
