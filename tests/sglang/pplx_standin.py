"""The stand-in of the SGLang pplx tests: ``pplx_kernels`` (its ``AllToAll`` needs GPUs, CUDA IPC or NVSHMEM), from
its released Python API (perplexityai/pplx-kernels 2bd6e30, ``src/pplx_kernels/all_to_all.py`` and
``nvshmem.py``):

- ``AllToAll.intranode(max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size, hidden_dim,
  hidden_dim_bytes, hidden_dim_scale_bytes, group_name="default")`` and ``AllToAll.internode(...)`` (the same less
  ``group_name``) check what the Python and the C++ constructor check (``world_size % dp_size == 0``, at least 2 DP
  groups, 16-byte token and scale bytes) and keep their arguments; every one a process builds is in
  ``AllToAll.built``;
- ``dispatch(out_expert_num_tokens, out_expert_x, out_expert_x_scale, dp_x, dp_x_scale, indices, bound_m, do_send,
  do_recv)`` moves each (token, expert) pair to the expert's rank over the process group (gloo here): each local
  expert's rows, in (source rank, token) order, in ``out_expert_x[expert, :n]`` and ``n`` in
  ``out_expert_num_tokens``; the kernel's ``numSendTokens <= maxNumTokens`` trap raised as a ``RuntimeError``;
- ``combine(out_tokens, indices, weights, expert_y, bound_m, ...)`` writes each token's sum over its experts of
  weight x the expert's output row;
- ``nvshmem_init(global_rank, local_rank, world_size, device, uid=None)`` records the call;
  ``pplx_kernels.nvshmem.PyTorchStreamWrapper`` wraps a stream.

``install(module)`` puts the package where SGLang imports it from (``pplx_kernels``, ``pplx_kernels.nvshmem``) and
on SGLang's ``token_dispatcher.pplx`` module in place of its failed import.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.distributed as dist

PPLX_TRAP = "csrc/all_to_all/intranode_dispatch.cu: numSendTokens <= maxNumTokens"


class AllToAll:
    built: list["AllToAll"] = []

    def __init__(self, kind: str, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                 hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, group_name=None):
        assert world_size % dp_size == 0
        assert world_size // dp_size > 1
        if hidden_dim_bytes % 16 or hidden_dim_scale_bytes % 16:  # PPLX_ASSERT: traps the process
            raise RuntimeError("csrc/all_to_all/all_to_all.cpp: invalid hidden dim bytes")
        self.kind, self.max_num_tokens, self.num_experts = kind, max_num_tokens, num_experts
        self.experts_per_token, self.rank, self.world_size, self.dp_size = experts_per_token, rank, world_size, dp_size
        self.hidden_dim, self.hidden_dim_bytes = hidden_dim, hidden_dim_bytes
        self.hidden_dim_scale_bytes, self.group_name = hidden_dim_scale_bytes, group_name
        self.local_experts = -(-num_experts // world_size)
        self._routes = None  # what dispatch sent where, for combine
        AllToAll.built.append(self)

    @classmethod
    def intranode(cls, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size, hidden_dim,
                  hidden_dim_bytes, hidden_dim_scale_bytes, group_name="default"):
        return cls("intranode", max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                   hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes, group_name)

    @classmethod
    def internode(cls, max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size, hidden_dim,
                  hidden_dim_bytes, hidden_dim_scale_bytes):
        return cls("internode", max_num_tokens, num_experts, experts_per_token, rank, world_size, dp_size,
                   hidden_dim, hidden_dim_bytes, hidden_dim_scale_bytes)

    def dispatch(self, out_expert_num_tokens, out_expert_x, out_expert_x_scale, dp_x, dp_x_scale, indices, bound_m,
                 do_send=True, do_recv=True):
        assert (out_expert_x_scale is None) == (dp_x_scale is None) == (self.hidden_dim_scale_bytes == 0)
        assert indices.dtype == torch.uint32 and indices.shape == (dp_x.shape[0], self.experts_per_token)
        tokens = int(bound_m[0]) if bound_m is not None else dp_x.shape[0]
        if tokens > self.max_num_tokens:
            raise RuntimeError(PPLX_TRAP)
        ids = indices[:tokens].to(torch.int64)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (dp_x[:tokens].float(), ids))
        out_expert_num_tokens.zero_()
        routes = {}  # (source rank, token, k) -> (local expert, row)
        for source, (x, source_ids) in enumerate(gathered):
            for token in range(x.shape[0]):
                for k, expert in enumerate(source_ids[token].tolist()):
                    if expert // self.local_experts != self.rank:
                        continue
                    local = expert % self.local_experts
                    row = int(out_expert_num_tokens[local])
                    out_expert_x[local, row] = x[token].to(out_expert_x.dtype)
                    out_expert_num_tokens[local] += 1
                    routes[(source, token, k)] = (local, row)
        self._routes = routes

    def combine(self, out_tokens, indices, weights, expert_y, bound_m, do_send=True, do_recv=True):
        tokens = int(bound_m[0]) if bound_m is not None else indices.shape[0]
        partial = {}  # source rank -> {(token, k): the weighted row}, from this rank's experts
        gathered_weights: list = [None] * self.world_size
        dist.all_gather_object(gathered_weights, weights[:tokens].float())
        for (source, token, k), (local, row) in self._routes.items():
            partial.setdefault(source, {})[(token, k)] = gathered_weights[source][token, k] * expert_y[local, row].float()
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, partial)  # every rank's rows, each rank keeps its own tokens'
        out = torch.zeros(tokens, out_tokens.shape[1])
        for sent in gathered:
            for (token, k), row in sent.get(self.rank, {}).items():
                out[token] += row
        out_tokens[:tokens] = out.to(out_tokens.dtype)

    def destroy(self) -> None:
        pass


initialized: list[dict] = []


def nvshmem_init(global_rank, local_rank, world_size, device, uid=None) -> None:
    initialized.append(dict(global_rank=global_rank, local_rank=local_rank, world_size=world_size, device=device))


class PyTorchStreamWrapper:
    def __init__(self, pt_stream):
        self.pt_stream = pt_stream
        self.handle = pt_stream.cuda_stream

    def __cuda_stream__(self):
        return (0, self.pt_stream.cuda_stream)


def install(module=None) -> None:
    """``from pplx_kernels import AllToAll, nvshmem_init`` and ``from pplx_kernels.nvshmem import
    PyTorchStreamWrapper`` find the stand-in; SGLang's ``token_dispatcher.pplx`` ``module``, when given (imported
    before, its ``try: from pplx_kernels import ...`` failed), gets what that import would have bound."""
    package, nvshmem = types.ModuleType("pplx_kernels"), types.ModuleType("pplx_kernels.nvshmem")
    package.AllToAll, package.nvshmem_init, package.PyTorchStreamWrapper = AllToAll, nvshmem_init, PyTorchStreamWrapper
    nvshmem.nvshmem_init, nvshmem.PyTorchStreamWrapper = nvshmem_init, PyTorchStreamWrapper
    package.nvshmem, package.__path__ = nvshmem, []
    sys.modules["pplx_kernels"], sys.modules["pplx_kernels.nvshmem"] = package, nvshmem
    if module is not None:
        module.AllToAll, module.nvshmem_init, module.use_pplx = AllToAll, nvshmem_init, True
