"""What a per-rank cap costs in DeepEP's low-latency buffer, by DeepEP's own arithmetic: its cap rules, its
pricing at any cap and what one rank's GPU gives up for it.

The buffer's ``num_rdma_bytes`` is the low-latency size hint for T tokens per rank (``deepep_low_latency.py``),
the hidden size and the experts DeepEP is given, or in ``auto`` mode the larger of that and normal mode's RDMA
hint; ``num_nvl_bytes`` is normal mode's NVLink buffer (``deepep_normal.py``). What the buffer bytes leave out:
DeepEP's 32 MiB workspace (``cudaMalloc``), and NVSHMEM's own heap, which it maps in 512 MiB steps
(``NVSHMEM_CUMEM_GRANULARITY``, set by DeepEP): the RDMA buffer occupies at least its size rounded up to one.
Which experts, modes and cap an engine gives DeepEP, and what it sets aside for the buffer, are the engine's
(SGLang's: ``sglang_engine/deepep.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.caps import PricedByFormula, align_up
from capwatch.sizing.checks import SizingError
from capwatch.sizing.deepep_low_latency import MAX_DISPATCH_TOKENS_PER_RANK, low_latency_layout

DEEPEP_WORKSPACE_BYTES = 32 << 20  # LEGACY_NUM_WORKSPACE_BYTES, cudaMalloc'd beside the buffer
NVSHMEM_HEAP_STEP_BYTES = 1 << 29  # NVSHMEM_CUMEM_GRANULARITY = 2**29, set by deep_ep.Buffer

DEEPEP = BackendCapRules(
    "deepep", max_cap_tokens=MAX_DISPATCH_TOKENS_PER_RANK,
    below_floor="DeepEP's dispatch assertion ends the rank below it (at CUDA-graph capture or the first full batch)",
    eager_prefill_dispatched=True, local_batch_cap=True, overflow_outcome="DeepEP's dispatch assertion ends the rank",
    memory="buffer", sized_by="DeepEP's size hints")


def memory_bytes_per_rank(num_rdma_bytes: int, num_nvl_bytes: int) -> int:
    """What one rank's GPU gives up for the buffer: the RDMA buffer as NVSHMEM maps it (rounded up to its 512 MiB
    steps), the NVLink buffer and DeepEP's 32 MiB workspace."""
    return align_up(num_rdma_bytes, NVSHMEM_HEAP_STEP_BYTES) + num_nvl_bytes + DEEPEP_WORKSPACE_BYTES


@dataclass(frozen=True)
class DeepEPPricing(PricedByFormula):
    """A DeepEP group's buffer per rank at any cap: everything but the cap, as a rank reports it (the advisor
    prices what-ifs, budgets and advice with it). The normal-mode bytes do not depend on the cap."""

    MAX_CAP = MAX_DISPATCH_TOKENS_PER_RANK

    ep_size: int
    hidden_size: int | None  # None: not known (then nothing prices)
    buffer_experts: int | None
    normal_nvl_bytes: int = 0
    normal_rdma_bytes: int = 0

    @classmethod
    def of_buffer(cls, ep_size: int, hidden_size: int | None, buffer) -> DeepEPPricing:
        """From what a rank reports: its hidden size and its ``DeepEPBuffer`` (mode, experts, normal-mode bytes).
        Either unknown (a source that does not see it: None) prices nothing."""
        if hidden_size is None or buffer is None:
            return cls(ep_size, None, None)
        return cls(ep_size, hidden_size, buffer.buffer_experts, buffer.normal_nvl_bytes, buffer.normal_rdma_bytes)

    @classmethod
    def of_config(cls, config, ep_size: int) -> DeepEPPricing:
        """The pricing of a rank's reported config (a ``RankConfig`` of a deepep rank, or a source's
        ``UnpricedConfig``)."""
        return cls.of_buffer(ep_size, config.hidden_size, getattr(config, "deepep", None))

    def bytes_per_rank(self, cap: int) -> int:
        if self.hidden_size is None or self.buffer_experts is None:
            raise SizingError("the DeepEP buffer's hidden size and experts are not known, so it cannot be priced")
        ll = low_latency_layout(cap, self.hidden_size, self.buffer_experts).rdma_bytes
        return self.normal_nvl_bytes + max(self.normal_rdma_bytes, ll)
