"""capwatch's dispatcher layer: FlashInfer-semantics A2A backends, cap guards, device counters.

Imports only torch; FlashInfer is imported lazily inside ``dispatcher.flashinfer_backend``.
"""

from .backend import A2ABackend, DispatchPairingError, compute_target_rank_id, local_expert_range
from .counters import CounterSnapshot, DispatchCounters
from .instrumented import CAP_ENV_VAR, CapOverflowError, InstrumentedDispatcher, OverflowEvent, suggested_cap

__all__ = [
    "A2ABackend",
    "CAP_ENV_VAR",
    "CapOverflowError",
    "CounterSnapshot",
    "DispatchCounters",
    "DispatchPairingError",
    "InstrumentedDispatcher",
    "OverflowEvent",
    "compute_target_rank_id",
    "local_expert_range",
    "suggested_cap",
]
