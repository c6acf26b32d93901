"""The store's knobs (built from the service's Settings by ``main.store_options``)."""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.advisor.policy import DEFAULT_POLICY, AdvisorPolicy


@dataclass(frozen=True)
class StoreOptions:
    window_s: float = 60.0
    fold_after_s: float = 6 * 3600.0
    retention_s: float = 2 * 86_400.0
    maintenance_interval_s: float = 30.0
    max_batch_reports: int = 1024
    # Reports accepted but not yet committed; past it, submits are refused (admission.py). 32 batches:
    # about a second of writer work, and room for a bulk loader (benchmarks/advice_latency.py keeps
    # ~21k in flight).
    max_pending_reports: int = 32 * 1024
    checkpoint_interval_s: float = 10.0  # a checkpoint re-serialises every changed rank: not too often
    max_clusters: int = 10_000  # clusters and ranks held at once (capacity.py)
    max_ranks: int = 100_000
    policy: AdvisorPolicy = DEFAULT_POLICY  # handed to the advisor's folding (advisor/folding.py)
