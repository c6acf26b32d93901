"""A buffer capwatch cannot size offline, priced from the bytes it reported at run time.

Some A2A libraries size their buffer in compiled code that needs the GPU, the network or the process group
(DeepEP v2's ``ElasticBuffer`` asks NCCL's topology; pplx-kernels, NIXL EP and Mooncake EP compute it in C++):
no function of theirs runs here. A rank then reports what its buffer holds (``buffer_bytes`` at its cap), and
that number is exact at that cap. Every other cap is priced in proportion to it — the buffers are per-token
slots, so they grow with the cap — which is an estimate, and says so: ``known_bytes_per_rank`` is the reported
number at the reported cap and None anywhere else, so no view states an estimate as a fact
(docs/sizing.md, "Reported bytes").
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.sizing.caps import CAP_ALIGNMENT, largest_aligned_cap
from capwatch.sizing.checks import SizingError, check_positive
from capwatch.sizing.price_basis import ESTIMATED, EXACT, PriceBasis

# The most bytes one rank's buffer may report: beyond any GPU's memory.
MAX_BUFFER_BYTES = 1 << 42


def check_buffer_bytes(buffer_bytes: int) -> int:
    """SizingError unless ``buffer_bytes`` is a plausible buffer (1 byte .. 4 TiB)."""
    check_positive("buffer_bytes", buffer_bytes)
    if buffer_bytes > MAX_BUFFER_BYTES:
        raise SizingError(f"buffer_bytes {buffer_bytes} is beyond any GPU's memory (at most {MAX_BUFFER_BYTES})")
    return buffer_bytes


@dataclass(frozen=True)
class ReportedPricing:
    """One rank's buffer per cap from what it reported: ``buffer_bytes`` at ``buffer_cap`` (None: not reported,
    then nothing prices)."""

    ep_size: int
    buffer_cap: int | None
    buffer_bytes: int | None

    def bytes_per_rank(self, cap: int) -> int:
        """The reported bytes at the reported cap; in proportion to the cap elsewhere (rounded up: an estimate)."""
        if self.buffer_cap is None or self.buffer_bytes is None:
            raise SizingError("the buffer's reported bytes are not known, so it cannot be priced")
        check_positive("cap", cap)
        if cap == self.buffer_cap:
            return self.buffer_bytes
        return -(-self.buffer_bytes * cap // self.buffer_cap)

    def known_bytes_per_rank(self, cap: int) -> int | None:
        """The bytes a rank reported, at the cap it reported them for; None at any other cap (an estimate only)."""
        if cap == self.buffer_cap and self.buffer_bytes is not None:
            return self.buffer_bytes
        return None

    def exact_at(self, cap: int) -> bool:
        return self.known_bytes_per_rank(cap) is not None

    def basis_at(self, cap: int) -> PriceBasis:
        """Exact at the reported cap; elsewhere an estimate in proportion to the reported bytes (nothing reported:
        nothing prices, and the advice never asks)."""
        if self.buffer_cap is None or self.buffer_bytes is None:
            return ESTIMATED
        return EXACT if self.exact_at(cap) else PriceBasis.in_proportion(self.buffer_cap, self.buffer_bytes)

    def largest_cap_within(self, budget_bytes_per_rank: int, alignment: int = CAP_ALIGNMENT,
                           max_cap: int = 1 << 20) -> int | None:
        return largest_aligned_cap(lambda cap: self.bytes_per_rank(cap) <= budget_bytes_per_rank, alignment, max_cap)


@dataclass(frozen=True)
class ReportedPlan:
    """``capwatch plan`` for a reported-bytes backend: one cap's buffer, and whether that is the reported number
    (exact) or priced in proportion to it (an estimate)."""

    cap: int
    ep_size: int
    buffer_cap: int
    buffer_bytes_reported: int
    bytes_per_rank: int
    bytes_group: int
    exact: bool

    def as_dict(self) -> dict:
        return dict(vars(self))


def plan_reported(cap: int, ep_size: int, buffer_cap: int, buffer_bytes: int, max_cap: int) -> ReportedPlan:
    """The buffer at ``cap`` from ``buffer_bytes`` reported at ``buffer_cap``; SizingError outside 1..max_cap."""
    for name, value in (("cap", cap), ("buffer cap", buffer_cap)):
        check_positive(name, value)
        if value > max_cap:
            raise SizingError(f"{name} {value} is above {max_cap}, the most this backend accepts")
    check_positive("ep_size", ep_size)
    pricing = ReportedPricing(ep_size, buffer_cap, check_buffer_bytes(buffer_bytes))
    per_rank = pricing.bytes_per_rank(cap)
    return ReportedPlan(cap=cap, ep_size=ep_size, buffer_cap=buffer_cap, buffer_bytes_reported=buffer_bytes,
                        bytes_per_rank=per_rank, bytes_group=per_rank * ep_size, exact=pricing.exact_at(cap))


def largest_reported_within(budget_bytes: int, ep_size: int, buffer_cap: int, buffer_bytes: int, max_cap: int, *,
                            alignment: int = CAP_ALIGNMENT) -> ReportedPlan:
    """The plan of the largest multiple of ``alignment`` (at most ``max_cap``) whose buffer fits ``budget_bytes``."""
    check_positive("budget_bytes", budget_bytes)
    pricing = ReportedPricing(ep_size, buffer_cap, check_buffer_bytes(buffer_bytes))
    cap = pricing.largest_cap_within(budget_bytes, alignment, max_cap)
    if cap is None:
        raise SizingError(f"no cap fits {budget_bytes} bytes per rank: the smallest aligned cap, {alignment}, "
                          f"already needs {pricing.bytes_per_rank(alignment)} bytes (in proportion to the "
                          f"{buffer_bytes} bytes reported at cap {buffer_cap})")
    return plan_reported(cap, ep_size, buffer_cap, buffer_bytes, max_cap)
