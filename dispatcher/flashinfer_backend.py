"""Adapters from the :class:`~dispatcher.backend.A2ABackend` contract to FlashInfer's MoE A2A.

FlashInfer is imported lazily, inside the adapters, so that this module imports on any machine.

* :class:`FlashInferMoeAlltoAllBackend` wraps ``flashinfer.comm.MoeAlltoAll`` (0.6.0 -
  0.7.2.post1; removed in 0.7.4). Its contract *is* ours: same dispatch and combine.
* :class:`FlashInferMoeEpBackend` wraps ``flashinfer.moe_ep.NVLinkOneSidedAlltoAll`` (0.7.2+,
  the only API in 0.7.4): payloads are ``[hidden_states, (hidden_states_scale), topk_ids,
  (topk_weights)]`` and results come back flat (``[ep_size * R, n]``); the adapter reshapes them
  to ``[ep_size, R, n]``. Its R keyword is ``max_tokens_per_rank`` in 0.7.2.x and
  ``runtime_max_tokens_per_rank`` in 0.7.4; the adapter reads which from the signature.

Send/recv counters (``counters_source``), one implementation for both adapters (:func:`dispatch_counts`):
``"workspace"`` reads the counter words FlashInfer writes into this rank's workspace
(:class:`WorkspaceCounts`; 0.7.4's two parity banks: :class:`ParityBankedWorkspaceCounts`);
``"derived"`` recomputes them on the device from what travelled (:class:`DerivedCounts`). 0.7.4's
Lamport transport (small steps) never touches the counter words, so 0.7.4 defaults to ``"derived"``.

Every class, method and keyword argument the adapters use is listed in
``tests/dispatcher/test_flashinfer_api.py``, which checks the list against the installed package
(``inspect.signature``) and, given a wheel, against its source (``ast``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence

import torch

from capwatch.sizing.flashinfer_one_sided import BuiltWorkspace, built_workspace

from .backend import A2ABackend, DispatchPairingError, plan_routes

# Metainfo indices where FlashInfer does not export them (0.6.x - 0.7.2.post1 order).
LEGACY_METAINFO_INDEX = {"FLAG_VAL_OFFSET_INDEX": 0, "SEND_COUNTERS_OFFSET_INDEX": 2, "RECV_COUNTERS_OFFSET_INDEX": 3}
COUNTER_SOURCES = ("workspace", "derived")
# NVLinkOneSidedAlltoAll.dispatch's name for R: 0.7.4's, then 0.7.2.x's.
MOE_EP_RUNTIME_TOKENS_KEYWORDS = ("runtime_max_tokens_per_rank", "max_tokens_per_rank")


# --- FlashInfer's signatures ------------------------------------------------------------------


def parameter_names(target) -> set[str]:
    """The parameters FlashInfer's callable ``target`` takes."""
    # A class's own __init__: the class signature may be a decorator's (*args, **kwargs), as
    # typing_extensions.deprecated makes of MoeAlltoAll.
    function = target.__init__ if inspect.isclass(target) else target
    return set(inspect.signature(function).parameters) - {"self"}


def _pick_keyword(method: Callable, options: Sequence[str]) -> str:
    names = parameter_names(method)
    for option in options:
        if option in names:
            return option
    raise TypeError(f"{method.__qualname__} takes none of {list(options)}; flashinfer changed its API")


# --- the counts of the latest dispatch: one implementation for both adapters ------------------------


class DispatchCounts:
    """What the contract's ``send_counts`` / ``recv_counts`` return for a FlashInfer adapter: ``send``
    and ``recv`` (``[ep_size]``, on the device; plain attributes where they can be, since the hot path
    reads them every dispatch), and :meth:`record`, which the adapter calls after every dispatch."""

    send: torch.Tensor
    recv: torch.Tensor

    def record(self, token_selected_experts: torch.Tensor, num_experts: int, runtime_max_tokens_per_rank: int,
               received_expert_ids: torch.Tensor, invalid_expert_id: int) -> None:
        """Nothing to do where the dispatch itself wrote the counts."""

    def traffic(self) -> torch.Tensor | None:
        """``send`` and ``recv`` as one ``[2, ep_size]`` view, or None where they are not one."""
        return None


def _workspace_int32(rank_bytes: torch.Tensor, offset: int, count: int) -> torch.Tensor:
    if offset % 4:
        raise RuntimeError(f"counter offset {offset} is not 4-byte aligned; flashinfer's layout changed")
    return rank_bytes[offset : offset + 4 * count].view(torch.int32)


class WorkspaceCounts(DispatchCounts):
    """Views of one rank's send and recv counter words in its workspace (``rank_bytes``), at the
    metainfo offsets: valid from the end of a dispatch until the next one."""

    def __init__(self, rank_bytes: torch.Tensor, metainfo: Sequence[int], index: dict[str, int], ep_size: int):
        self.send = _workspace_int32(rank_bytes, int(metainfo[index["SEND_COUNTERS_OFFSET_INDEX"]]), ep_size)
        self.recv = _workspace_int32(rank_bytes, int(metainfo[index["RECV_COUNTERS_OFFSET_INDEX"]]), ep_size)
        self.ep_size = ep_size

    def traffic(self) -> torch.Tensor:
        """``[2, ep_size]`` int32: the send row and the receive row, one strided view of the workspace
        (counted by ``DispatchCounters.record_counter_words`` at every dispatch)."""
        gap = self.recv.storage_offset() - self.send.storage_offset()  # in int32 words
        if gap < self.ep_size:
            raise RuntimeError(f"flashinfer's receive counters start {gap} words after the send counters; "
                               f"capwatch expects them after all {self.ep_size}")
        return self.send.as_strided((2, self.ep_size), (gap, 1))


class ParityBankedWorkspaceCounts(DispatchCounts):
    """0.7.4's layout: the recv counters are two banks ``int32[2][ep_size]``, the round's bank being
    ``((flag_val - 1) >> 1) & 1`` with ``flag_val`` the uint32 at ``FLAG_VAL``; selected on the device
    at each read (no sync)."""

    def __init__(self, rank_bytes: torch.Tensor, metainfo: Sequence[int], index: dict[str, int], ep_size: int):
        self.send = _workspace_int32(rank_bytes, int(metainfo[index["SEND_COUNTERS_OFFSET_INDEX"]]), ep_size)
        recv_offset = int(metainfo[index["RECV_COUNTERS_OFFSET_INDEX"]])
        self._banks = _workspace_int32(rank_bytes, recv_offset, 2 * ep_size).view(2, ep_size)
        self._flag = _workspace_int32(rank_bytes, int(metainfo[index["FLAG_VAL_OFFSET_INDEX"]]), 1)

    @property
    def recv(self) -> torch.Tensor:
        flag = self._flag.long() & 0xFFFFFFFF  # the word is a uint32
        bank = ((flag - 1) >> 1) & 1
        return self._banks.index_select(0, bank).squeeze(0)


class DerivedCounts(DispatchCounts):
    """Recomputed on the device after each dispatch from what travelled: send counts from the routing
    (``plan_routes``), recv counts as the received rows whose expert ids are not all the invalid id."""

    def __init__(self, ep_size: int, device: torch.device):
        self._traffic = torch.zeros(2, ep_size, dtype=torch.int64, device=device)
        self.send, self.recv = self._traffic[0], self._traffic[1]

    def traffic(self) -> torch.Tensor:
        return self._traffic

    def record(self, token_selected_experts: torch.Tensor, num_experts: int, runtime_max_tokens_per_rank: int,
               received_expert_ids: torch.Tensor, invalid_expert_id: int) -> None:
        plan = plan_routes(token_selected_experts, num_experts, self.send.numel(), runtime_max_tokens_per_rank)
        self.send.copy_(plan.send_counts)
        self.recv.copy_((received_expert_ids != invalid_expert_id).any(-1).sum(-1))  # [ep, R, k] -> [ep]


def check_counters_source(counters_source: str) -> None:
    if counters_source not in COUNTER_SOURCES:
        raise ValueError(f"counters_source must be one of {COUNTER_SOURCES}, got {counters_source!r}")


def dispatch_counts(counters_source: str, ep_size: int, device: torch.device,
                    workspace: Callable[[], DispatchCounts]) -> DispatchCounts:
    """The counts ``counters_source`` names; ``workspace()`` makes the workspace's views (only called
    for that source: on 0.7.4 it loads FlashInfer's JIT module for the layout constants)."""
    check_counters_source(counters_source)
    return workspace() if counters_source == "workspace" else DerivedCounts(ep_size, device)


# --- the legacy class API (0.6.0 - 0.7.2.post1) ---------------------------------------------------


class FlashInferMoeAlltoAllBackend(A2ABackend):
    """``flashinfer.comm.MoeAlltoAll`` behind the A2ABackend contract: a new one (the constructor) or
    one an engine already made (:meth:`adopt`, no second workspace)."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        max_num_tokens: int,
        dispatch_bytes_per_token: int,
        combine_bytes_per_token: int,
        group=None,
        gpus_per_node: int | None = None,
        counters_source: str = "workspace",
    ):
        import torch.distributed as dist
        from flashinfer.comm import Mapping, MoeAlltoAll, moe_a2a_get_workspace_size_per_rank
        from flashinfer.comm.comm_backend import TorchDistBackend
        from flashinfer.comm.mnnvl import MnnvlConfig

        check_counters_source(counters_source)  # before the workspace is allocated
        ep_rank, ep_size = dist.get_rank(group), dist.get_world_size(group)
        mapping = Mapping(
            world_size=ep_size, rank=ep_rank,
            gpus_per_node=gpus_per_node or torch.cuda.device_count(), moe_ep_size=ep_size,
        )
        workspace_bytes = moe_a2a_get_workspace_size_per_rank(
            ep_size, max_num_tokens, dispatch_bytes_per_token, combine_bytes_per_token
        )
        with warnings.catch_warnings():  # deprecated since 0.7.1 in favour of moe_ep; still the 0.6.x API
            warnings.simplefilter("ignore", DeprecationWarning)
            alltoall = MoeAlltoAll(
                mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank=workspace_bytes,
                mnnvl_config=MnnvlConfig(comm_backend=TorchDistBackend(group)),
            )
        self._attach(alltoall, counters_source)

    @classmethod
    def adopt(cls, alltoall, counters_source: str = "workspace") -> "FlashInferMoeAlltoAllBackend":
        """Wrap an existing ``MoeAlltoAll`` (e.g. SGLang's ``FlashinferDispatcher.moe_a2a``): its
        workspace, its geometry; nothing is allocated but two ``[ep_size]`` count vectors."""
        backend = cls.__new__(cls)
        backend._attach(alltoall, counters_source)
        backend._adopted = True
        return backend

    def _attach(self, alltoall, counters_source: str) -> None:
        A2ABackend.__init__(self)
        self._adopted = False
        self.alltoall = alltoall
        self.ep_rank, self.ep_size = int(alltoall.ep_rank), int(alltoall.ep_size)
        self.num_experts, self.top_k = int(alltoall.num_experts), int(alltoall.top_k)
        self.max_num_tokens = int(alltoall.max_num_tokens)
        self.device = alltoall.workspace.device
        self.counters_source = counters_source
        index = getattr(type(alltoall), "_METAINFO_INDEX", None) or LEGACY_METAINFO_INDEX
        # metainfo is a CPU tensor: reading it here is no device sync, and it never changes.
        self.metainfo = [int(v) for v in alltoall.metainfo.tolist()]
        self._counts = dispatch_counts(counters_source, self.ep_size, self.device, lambda: WorkspaceCounts(
            alltoall.workspace[self.ep_rank], self.metainfo, index, self.ep_size))
        self._combine_options: dict = {}

    @property
    def workspace(self) -> torch.Tensor:
        return self.alltoall.workspace

    def traffic_counts(self) -> torch.Tensor | None:
        """The send and receive counts as one ``[2, ep_size]`` view (valid from the end of a dispatch until the
        next): the workspace's int32 counter words, or the derived int64 counts; None for 0.7.4's banked
        receive words (a bank chosen on the device per read)."""
        return self._counts.traffic()

    @property
    def send_counts(self) -> torch.Tensor:
        return self._counts.send

    @property
    def recv_counts(self) -> torch.Tensor:
        return self._counts.recv

    def dispatch(self, token_selected_experts, payloads, runtime_max_tokens_per_rank,
                 invalid_token_expert_id=None, expert_id_payload_index=None):
        """The contract's dispatch. An adopted MoeAlltoAll keeps its engine's inputs as they are: the
        engine and FlashInfer validate them (SGLang passes R = 0 for a step idle on every rank, which
        the contract's check refuses), so only the pairing is kept - and the hot path saves the check."""
        if not self._adopted:
            return super().dispatch(token_selected_experts, payloads, runtime_max_tokens_per_rank,
                                    invalid_token_expert_id, expert_id_payload_index)
        if self._dispatched_runtime_tokens is not None:
            raise DispatchPairingError("dispatch called twice without combine: call combine() first")
        received = self._dispatch(token_selected_experts, payloads, runtime_max_tokens_per_rank,
                                  invalid_token_expert_id, expert_id_payload_index)
        self._dispatched_runtime_tokens = runtime_max_tokens_per_rank
        return received

    def _dispatch(self, token_selected_experts, payloads, runtime_max_tokens_per_rank,
                  invalid_token_expert_id, expert_id_payload_index):
        if self.counters_source == "derived" and expert_id_payload_index is None:
            raise ValueError("counters_source='derived' needs the expert ids as a payload: pass "
                             "invalid_token_expert_id and expert_id_payload_index")
        received = self.alltoall.dispatch(
            token_selected_experts, payloads, runtime_max_tokens_per_rank,
            invalid_token_expert_id=invalid_token_expert_id, expert_id_payload_index=expert_id_payload_index,
        )
        if expert_id_payload_index is not None:  # derived counts need it (checked above); the workspace's do not
            self._counts.record(token_selected_experts, self.num_experts, runtime_max_tokens_per_rank,
                                received[expert_id_payload_index], invalid_token_expert_id)
        return received

    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int, **options) -> torch.Tensor:
        """The contract's combine; ``options`` (``payload_in_workspace``, ...) go to MoeAlltoAll.combine."""
        self._combine_options = options
        try:
            return super().combine(payload, runtime_max_tokens_per_rank)
        finally:
            self._combine_options = {}

    def _combine(self, payload, runtime_max_tokens_per_rank):
        return self.alltoall.combine(payload, runtime_max_tokens_per_rank, **self._combine_options)


# --- the moe_ep API (0.7.2+) -----------------------------------------------------------------------


class FlashInferMoeEpBackend(A2ABackend):
    """``flashinfer.moe_ep.NVLinkOneSidedAlltoAll`` behind the A2ABackend contract.

    Payloads: ``[hidden_states, topk_ids, topk_weights]`` or ``[hidden_states,
    hidden_states_scale, topk_ids, topk_weights]`` with ``expert_id_payload_index`` naming
    topk_ids (moe_ep routes by the ids it sends, so ``token_selected_experts`` is sent there). Expert
    ids of padding rows are always set to ``invalid_expert_id`` (fixed at construction).
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        max_tokens_per_rank: int,
        hidden_size: int,
        dtype: torch.dtype = torch.bfloat16,
        invalid_expert_id: int = -1,
        group=None,
        counters_source: str | None = None,
    ):
        super().__init__()
        import torch.distributed as dist
        from flashinfer.moe_ep import BootstrapConfig, MoEEpCommParams, NVLinkOneSidedAlltoAll, NVLinkOneSidedConfig

        self.ep_rank, self.ep_size = dist.get_rank(group), dist.get_world_size(group)
        self.num_experts, self.top_k = num_experts, top_k
        self.invalid_expert_id = invalid_expert_id
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.comm = NVLinkOneSidedAlltoAll(
            BootstrapConfig(world_size=self.ep_size, rank=self.ep_rank, process_group=group),
            MoEEpCommParams(num_experts=num_experts, top_k=top_k, max_tokens_per_rank=max_tokens_per_rank,
                            hidden_size=hidden_size, dtype=dtype, invalid_expert_id=invalid_expert_id),
            NVLinkOneSidedConfig(),
        )
        self._runtime_keyword = _pick_keyword(type(self.comm).dispatch, MOE_EP_RUNTIME_TOKENS_KEYWORDS)
        legacy_inside = hasattr(type(self.comm), "alltoall")  # 0.7.2.x builds on MoeAlltoAll
        if counters_source is None:
            counters_source = "workspace" if legacy_inside else "derived"
        self.counters_source = counters_source
        self._counts = dispatch_counts(self.counters_source, self.ep_size, self.device,
                                       lambda: self._workspace_counts(legacy_inside))

    def _workspace_counts(self, legacy_inside: bool) -> DispatchCounts:
        if legacy_inside:
            inner = self.comm.alltoall
            index = getattr(type(inner), "_METAINFO_INDEX", None) or LEGACY_METAINFO_INDEX
            return WorkspaceCounts(inner.workspace[self.ep_rank], inner.metainfo.tolist(), index, self.ep_size)
        # 0.7.4: its own layout, indices exported by the JIT module
        from flashinfer.moe_ep.backends.split.comm.nvlink_one_sided.kernels import layout_constants

        return ParityBankedWorkspaceCounts(self.comm.workspace[self.ep_rank], self.comm.metainfo.tolist(),
                                           vars(layout_constants()), self.ep_size)

    def built_workspace(self) -> BuiltWorkspace | None:
        """0.7.4: what the built object says of its workspace (``sizing.flashinfer_one_sided.BuiltWorkspace``: its
        bytes per rank, CFT, the Lamport limit and bytes), the truth where CFT or Lamport is on; report
        ``workspace_bytes_per_rank`` and the regions (``FlashInferParams``). None on 0.7.2.x (no such regions)."""
        if not hasattr(self.comm, "lamport_max_tokens"):
            return None
        from flashinfer.moe_ep.backends.split.comm.nvlink_one_sided.kernels import layout_constants

        return built_workspace(self.comm.metainfo.tolist(), vars(layout_constants()), self.comm.lamport_max_tokens,
                               self.comm._lamport_workspace_bytes)

    @property
    def send_counts(self) -> torch.Tensor:
        return self._counts.send

    @property
    def recv_counts(self) -> torch.Tensor:
        return self._counts.recv

    def _dispatch(self, token_selected_experts, payloads, runtime_max_tokens_per_rank,
                  invalid_token_expert_id, expert_id_payload_index):
        if len(payloads) not in (3, 4) or expert_id_payload_index != len(payloads) - 2:
            raise ValueError(
                "moe_ep dispatch carries [hidden_states, (hidden_states_scale), topk_ids, topk_weights]; "
                "pass expert_id_payload_index pointing at topk_ids"
            )
        if invalid_token_expert_id != self.invalid_expert_id:
            raise ValueError(f"moe_ep fixes invalid_expert_id at construction ({self.invalid_expert_id}), "
                             f"got {invalid_token_expert_id}")
        if payloads[expert_id_payload_index].shape != token_selected_experts.shape:
            raise ValueError("moe_ep routes by the topk_ids it sends: that payload must be token_selected_experts")
        scale = payloads[1] if len(payloads) == 4 else None
        result = self.comm.dispatch(
            payloads[0], token_selected_experts, payloads[-1], hidden_states_scale=scale,
            **{self._runtime_keyword: runtime_max_tokens_per_rank},
        )
        flat = [result.hidden_states] + ([result.hidden_states_scale] if scale is not None else []) \
            + [result.topk_ids, result.topk_weights]
        received = [tensor.view(self.ep_size, runtime_max_tokens_per_rank, -1) for tensor in flat]
        self._counts.record(token_selected_experts, self.num_experts, runtime_max_tokens_per_rank,
                            received[expert_id_payload_index], self.invalid_expert_id)
        return received

    def _combine(self, payload, runtime_max_tokens_per_rank):
        return self.comm.combine(payload)

