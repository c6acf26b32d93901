"""The stand-in of the SGLang MoRI tests: the ``mori`` package (its ops need a ROCm GPU and MoRI's symmetric heap),
and the one ``aiter`` entry SGLang's EPv1 dispatcher binds at construction.

Built from MoRI v1.2.2's released Python API (``python/mori/ops/dispatch_combine.py``): ``EpDispatchCombineConfig``
(the same dataclass fields, which SGLang's ``check_mori_compatibility`` reads), ``EpDispatchCombineKernelType``,
``EpDispatchCombineOp(config)`` with ``config``, ``max_num_tokens_to_recv()``, ``local_expert_count``,
``dispatch(input, weights, scales, indices, ...)`` returning ``(tokens, weights, scales, indices, total received)``
and ``combine(input, weights, indices)`` returning ``(tokens, weights)``, and ``mori.shmem``'s group init. The
tokens move with ``all_to_all_single`` over the process group (gloo here): each token goes once to each rank that
holds one of its experts, as MoRI's kernels send it, and each rank receives into ``world_size x T`` rows.

MoRI checks nothing: like its kernels, the stand-in takes a batch above ``max_num_inp_token_per_rank`` without a
word and loses what does not fit its buffers (MoRI writes past them: ROCm/mori#356). It counts such calls in
``EpDispatchCombineOp.overflowed`` so a test can tell whether an over-cap batch ever reached MoRI.

``install()`` puts ``mori`` in ``sys.modules``; ``install_aiter(module)`` gives SGLang's ``moriep`` module the
quantizer lookup it binds in ``_MoriEPv1DispatcherImplBase.__init__`` (bf16 dispatch never calls it).
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass

import torch
import torch.distributed as dist


class EpDispatchCombineKernelType(enum.Enum):
    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4
    IntraNodeLL = 5

    def __str__(self):
        return self.name


@dataclass
class EpDispatchCombineConfig:
    data_type: torch.dtype
    rank: int
    world_size: int
    hidden_dim: int
    scale_dim: int
    scale_type_size: int
    max_token_type_size: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    warp_num_per_block: int = 8
    block_num: int = 80
    max_total_recv_tokens: int = 0
    use_external_inp_buf: bool = True
    kernel_type: EpDispatchCombineKernelType = EpDispatchCombineKernelType.IntraNode
    gpu_per_node: int = 8
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1
    quant_type: str = "none"


class EpDispatchCombineOp:
    built: list["EpDispatchCombineOp"] = []  # every op this process built
    overflowed = 0  # dispatches that brought more tokens than the cap (MoRI would have written past its buffers)

    def __init__(self, config: EpDispatchCombineConfig):
        self.config = config
        self.local_expert_count = torch.zeros(config.num_experts_per_rank, dtype=torch.int32)
        self._routing = None
        EpDispatchCombineOp.built.append(self)

    def max_num_tokens_to_recv(self) -> int:
        config = self.config
        per_rank = config.max_num_inp_token_per_rank
        if config.max_total_recv_tokens > 0:
            per_rank = min(-(-config.max_total_recv_tokens // config.world_size), per_rank)
        return config.world_size * per_rank

    def dispatch(self, input, weights, scales, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1,
                 call_local_expert_count=False, **more):
        config = self.config
        cap, ranks, hidden, top_k = (config.max_num_inp_token_per_rank, config.world_size, config.hidden_dim,
                                     config.num_experts_per_token)
        if input.size(0) > cap:
            EpDispatchCombineOp.overflowed += 1  # no check in MoRI: what does not fit is lost (or worse)
        tokens = min(input.size(0), cap)
        width = hidden + 2 * top_k + 2  # the token, its weights, its expert ids, its index, a valid flag
        send = torch.zeros(ranks, cap, width, dtype=torch.float32)
        filled = [0] * ranks
        for token in range(tokens):
            experts = indices[token].tolist()
            for rank in sorted({expert // config.num_experts_per_rank for expert in experts if expert >= 0}):
                row = send[rank, filled[rank]]
                row[:hidden] = input[token].float()
                row[hidden:hidden + top_k] = weights[token].float()
                row[hidden + top_k:hidden + 2 * top_k] = indices[token].float()
                row[-2], row[-1] = token, 1.0
                filled[rank] += 1
        received = torch.empty_like(send)
        dist.all_to_all_single(received.view(ranks, -1), send.view(ranks, -1))
        rows = self.max_num_tokens_to_recv()
        out = torch.zeros(rows, hidden, dtype=input.dtype)
        out_weights = torch.zeros(rows, top_k, dtype=torch.float32)
        out_indices = torch.full((rows, top_k), -1, dtype=indices.dtype)
        routing = []  # (source rank, its token) of each received row
        for rank in range(ranks):
            for slot in range(cap):
                row = received[rank, slot]
                if row[-1] > 0:
                    index = len(routing)
                    out[index] = row[:hidden].to(input.dtype)
                    out_weights[index] = row[hidden:hidden + top_k]
                    out_indices[index] = row[hidden + top_k:hidden + 2 * top_k].to(indices.dtype)
                    routing.append((rank, int(row[-2])))
        self._routing = (routing, tokens)
        total = torch.tensor([len(routing)], dtype=torch.int32)
        return out, out_weights, None, out_indices, total

    def combine(self, input, weights, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1, **more):
        """Each received row back to its source rank and token, where the rows of one token are summed."""
        config = self.config
        cap, ranks, hidden = config.max_num_inp_token_per_rank, config.world_size, config.hidden_dim
        routing, tokens = self._routing
        back = torch.zeros(ranks, cap, hidden + 2, dtype=torch.float32)
        filled = [0] * ranks
        for index, (rank, token) in enumerate(routing):
            row = back[rank, filled[rank]]
            row[:hidden], row[hidden], row[hidden + 1] = input[index].float(), token, 1.0
            filled[rank] += 1
        returned = torch.empty_like(back)
        dist.all_to_all_single(returned.view(ranks, -1), back.view(ranks, -1))
        out = torch.zeros(tokens, hidden, dtype=torch.float32)
        for rank in range(ranks):
            for slot in range(cap):
                row = returned[rank, slot]
                if row[-1] > 0:
                    out[int(row[hidden])] += row[:hidden]
        return out.to(input.dtype), None

    # AsyncLL's halves (SGLang's low-latency impl): the whole transfer in the send half here.
    def dispatch_send(self, input, weights, scales, indices, **more):
        return self.dispatch(input, weights, scales, indices)

    def dispatch_recv(self, **more):
        return None

    def combine_send(self, input, weights, indices, **more):
        return self.combine(input, weights, indices)

    def combine_recv(self, **more):
        return None


def _shmem_torch_process_group_init(group_name: str) -> None:
    """MoRI's symmetric heap over the registered group: nothing to map without a GPU."""


def install() -> types.ModuleType:
    """``import mori`` (``mori.ops``, ``mori.shmem``) as SGLang's ``init_mori_op`` uses it."""
    mori = types.ModuleType("mori")
    mori.ops = types.ModuleType("mori.ops")
    mori.shmem = types.ModuleType("mori.shmem")
    for name in ("EpDispatchCombineKernelType", "EpDispatchCombineConfig", "EpDispatchCombineOp"):
        setattr(mori.ops, name, globals()[name])
    mori.shmem.shmem_torch_process_group_init = _shmem_torch_process_group_init
    sys.modules.update({"mori": mori, "mori.ops": mori.ops, "mori.shmem": mori.shmem})
    return mori


def install_aiter(module) -> None:
    """The quantizers SGLang's EPv1 impl looks up at construction (``get_hip_quant``; ROCm's aiter): bf16 dispatch
    never calls them."""
    def get_hip_quant(kind):
        def quantize(*args, **kwargs):
            raise NotImplementedError(f"the stand-in has no {kind} quantizer: dispatch bf16")
        return quantize

    module.QuantType = types.SimpleNamespace(per_1x128="per_1x128", per_1x32="per_1x32")
    module.get_hip_quant = get_hip_quant
