"""The all-to-all backend contract, with FlashInfer MoE A2A semantics.

A backend moves each local token to every EP rank that owns one of its top-k experts
(``dispatch``) and sums the expert outputs back onto the token's home rank (``combine``):

* ``dispatch(token_selected_experts [T, top_k] int32, payloads [[T, n_i], ...], R)`` returns
  one receive tensor ``[ep_size, R, n_i]`` per payload. ``T > R`` is refused (its rows would
  overwrite another rank's). Row ``[src, j]`` holds the j-th token rank ``src`` sent here. A
  token goes to a rank **once**, however many of its top-k experts that rank owns. ``R``
  (``runtime_max_tokens_per_rank``) is the largest local batch of the step over all ranks;
  every rank passes the same value.
* Ordering: FlashInfer assigns slots with ``atomicAdd`` (any order); the backends here order a
  source's tokens by local token index, so results are deterministic and comparable.
* Rows ``j >= recv_counts[src]`` are padding. With ``invalid_token_expert_id`` and
  ``expert_id_payload_index`` the expert ids of padding rows are set to that sentinel.
* ``combine(payload [ep_size, R, H], R)`` returns ``[T, H]``: for each local token, the sum of
  the rows the target ranks computed for it.
* ``send_counts`` / ``recv_counts`` (``[ep_size]``, device-resident) hold the tokens this rank
  sent to / received from each rank in the latest dispatch.
* Every ``dispatch`` must be followed by exactly one ``combine`` (FlashInfer's workspace holds
  one round at a time); breaking the pairing raises :class:`DispatchPairingError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_TOP_K = 22  # FlashInfer's kMaxTopK since 0.6.8


class DispatchPairingError(RuntimeError):
    """dispatch twice without combine, or combine without dispatch."""


# --- expert -> rank mapping ----------------------------------------------------------------------


def _check_geometry(num_experts: int, ep_size: int) -> None:
    if ep_size <= 0:
        raise ValueError(f"ep_size must be positive, got {ep_size}")
    if num_experts < ep_size:
        raise ValueError(f"num_experts ({num_experts}) must be >= ep_size ({ep_size}): every rank owns an expert")


def local_expert_range(rank: int, num_experts: int, ep_size: int) -> range:
    """Experts owned by ``rank``: contiguous blocks, the first ``E % ep`` ranks one larger."""
    _check_geometry(num_experts, ep_size)
    if not 0 <= rank < ep_size:
        raise ValueError(f"rank {rank} is outside [0, {ep_size})")
    base, remainder = divmod(num_experts, ep_size)
    start = rank * base + min(rank, remainder)
    return range(start, start + base + (1 if rank < remainder else 0))


def compute_target_rank_id(expert_ids: torch.Tensor, num_experts: int, ep_size: int) -> torch.Tensor:
    """FlashInfer's ``compute_target_rank_id``, elementwise on a tensor of expert ids.

    ``base = E // ep``, ``rem = E % ep``; with ``rem == 0`` rank = e // base; otherwise the first
    ``rem`` ranks own ``base + 1`` experts each, the rest ``base``.
    """
    _check_geometry(num_experts, ep_size)
    base, remainder = divmod(num_experts, ep_size)
    if remainder == 0:
        return torch.div(expert_ids, base, rounding_mode="floor")
    boundary = remainder * (base + 1)
    large = torch.div(expert_ids, base + 1, rounding_mode="floor")
    small = remainder + torch.div(expert_ids - boundary, base, rounding_mode="floor")
    return torch.where(expert_ids < boundary, large, small)


# --- the routing plan of one dispatch ------------------------------------------------------------


@dataclass(frozen=True)
class RoutePlan:
    """Where each local token goes, computed with fixed-shape tensor ops only.

    ``slot[t, r]`` is the flat row ``r * R + j`` of the token in the ``[ep_size * R]`` send
    buffer when token t goes to rank r (j = its order among the tokens sent to r), else the
    discard row ``ep_size * R``. ``send_counts[r]`` = tokens sent to r.
    """

    goes_to: torch.Tensor  # bool [T, ep_size]
    slot: torch.Tensor  # int64 [T, ep_size]
    send_counts: torch.Tensor  # int64 [ep_size]
    runtime_max_tokens_per_rank: int

    @property
    def discard_row(self) -> int:
        return self.goes_to.shape[1] * self.runtime_max_tokens_per_rank


def plan_routes(
    token_selected_experts: torch.Tensor, num_experts: int, ep_size: int, runtime_max_tokens_per_rank: int
) -> RoutePlan:
    target_rank = compute_target_rank_id(token_selected_experts.long(), num_experts, ep_size)  # [T, k]
    num_tokens = token_selected_experts.shape[0]
    goes_to = torch.zeros(num_tokens, ep_size, dtype=torch.bool, device=token_selected_experts.device)
    goes_to.scatter_(1, target_rank, True)  # several slots on one rank -> one True
    order = goes_to.cumsum(0) - 1  # j-th token to rank r, in local token order
    rank_base = torch.arange(ep_size, device=goes_to.device) * runtime_max_tokens_per_rank
    discard = ep_size * runtime_max_tokens_per_rank
    slot = torch.where(goes_to, rank_base + order, discard)
    return RoutePlan(goes_to, slot, goes_to.sum(0), runtime_max_tokens_per_rank)


def padding_rows(recv_counts: torch.Tensor, runtime_max_tokens_per_rank: int) -> torch.Tensor:
    """bool ``[ep_size, R]``: True where row ``[src, j]`` carries no token."""
    positions = torch.arange(runtime_max_tokens_per_rank, device=recv_counts.device)
    return positions.unsqueeze(0) >= recv_counts.unsqueeze(1)


# --- the interface -------------------------------------------------------------------------------


def validate_dispatch_inputs(
    token_selected_experts: torch.Tensor,
    payloads: Sequence[torch.Tensor],
    runtime_max_tokens_per_rank: int,
    top_k: int,
    invalid_token_expert_id: int | None,
    expert_id_payload_index: int | None,
) -> None:
    """Shape/dtype checks FlashInfer makes, plus ``T <= R`` which it does not, on host-side
    metadata only (no device reads)."""
    if token_selected_experts.dim() != 2 or token_selected_experts.dtype != torch.int32:
        raise ValueError(
            "token_selected_experts must be an int32 [tokens, top_k] tensor, got "
            f"{token_selected_experts.dtype} {tuple(token_selected_experts.shape)}"
        )
    if token_selected_experts.shape[1] != top_k:
        raise ValueError(f"token_selected_experts has top_k {token_selected_experts.shape[1]}, the backend {top_k}")
    if not 1 <= len(payloads) <= 6:
        raise ValueError(f"dispatch takes 1 to 6 payloads, got {len(payloads)}")
    num_tokens = token_selected_experts.shape[0]
    for index, payload in enumerate(payloads):
        if payload.dim() != 2 or payload.shape[0] != num_tokens:
            raise ValueError(f"payload {index} must be [{num_tokens}, n], got {tuple(payload.shape)}")
    if isinstance(runtime_max_tokens_per_rank, bool) or not isinstance(runtime_max_tokens_per_rank, int) \
            or runtime_max_tokens_per_rank <= 0:
        raise ValueError(f"runtime_max_tokens_per_rank must be a positive int, got {runtime_max_tokens_per_rank!r}")
    if num_tokens > runtime_max_tokens_per_rank:
        # Each source rank owns R receive rows on every target: more local tokens than R would
        # write into the next rank's rows (FlashInfer up to 0.7.2.post1 does exactly that).
        raise ValueError(
            f"{num_tokens} local tokens but runtime_max_tokens_per_rank is {runtime_max_tokens_per_rank}: they "
            "would overwrite other ranks' receive slots. Pass R >= the largest local token count over all ranks."
        )
    if (invalid_token_expert_id is None) != (expert_id_payload_index is None):
        raise ValueError("invalid_token_expert_id and expert_id_payload_index go together: pass both or neither")
    if expert_id_payload_index is not None and not 0 <= expert_id_payload_index < len(payloads):
        raise ValueError(f"expert_id_payload_index {expert_id_payload_index} is not a payload index")


class A2ABackend(ABC):
    """Dispatch/combine over one EP group. Subclasses implement ``_dispatch`` and ``_combine``;
    this class enforces the dispatch -> combine pairing."""

    ep_rank: int
    ep_size: int
    num_experts: int
    top_k: int
    device: torch.device

    def __init__(self) -> None:
        self._dispatched_runtime_tokens: int | None = None

    @property
    @abstractmethod
    def send_counts(self) -> torch.Tensor:
        """[ep_size] tokens sent to each rank by the latest dispatch (device-resident)."""

    @property
    @abstractmethod
    def recv_counts(self) -> torch.Tensor:
        """[ep_size] tokens received from each rank by the latest dispatch (device-resident)."""

    def traffic_counts(self) -> torch.Tensor | None:
        """``send_counts`` and ``recv_counts`` as one ``[2, ep_size]`` view (the sent row, the received row), where
        the backend keeps them so: what a layer's counting adds in one op (``dispatcher.counting.CounterWords``).
        None where they are not one view (the counting then copies them into a record)."""
        return None

    def dispatch(
        self,
        token_selected_experts: torch.Tensor,
        payloads: Sequence[torch.Tensor],
        runtime_max_tokens_per_rank: int,
        invalid_token_expert_id: int | None = None,
        expert_id_payload_index: int | None = None,
    ) -> list[torch.Tensor]:
        if self._dispatched_runtime_tokens is not None:
            raise DispatchPairingError("dispatch called twice without combine: call combine() first")
        validate_dispatch_inputs(
            token_selected_experts, payloads, runtime_max_tokens_per_rank, self.top_k,
            invalid_token_expert_id, expert_id_payload_index,
        )
        received = self._dispatch(
            token_selected_experts, list(payloads), runtime_max_tokens_per_rank,
            invalid_token_expert_id, expert_id_payload_index,
        )
        self._dispatched_runtime_tokens = runtime_max_tokens_per_rank
        return received

    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int) -> torch.Tensor:
        if self._dispatched_runtime_tokens is None:
            raise DispatchPairingError("combine called before dispatch")
        if runtime_max_tokens_per_rank != self._dispatched_runtime_tokens:
            raise ValueError(
                f"combine got runtime_max_tokens_per_rank={runtime_max_tokens_per_rank}, "
                f"the dispatch used {self._dispatched_runtime_tokens}"
            )
        expected = (self.ep_size, runtime_max_tokens_per_rank)
        if payload.dim() != 3 or tuple(payload.shape[:2]) != expected:
            raise ValueError(f"combine payload must be [{expected[0]}, {expected[1]}, H], got {tuple(payload.shape)}")
        output = self._combine(payload, runtime_max_tokens_per_rank)
        self._dispatched_runtime_tokens = None
        return output

    @abstractmethod
    def _dispatch(
        self,
        token_selected_experts: torch.Tensor,
        payloads: list[torch.Tensor],
        runtime_max_tokens_per_rank: int,
        invalid_token_expert_id: int | None,
        expert_id_payload_index: int | None,
    ) -> list[torch.Tensor]: ...

    @abstractmethod
    def _combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int) -> torch.Tensor: ...
