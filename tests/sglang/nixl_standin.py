"""The stand-in of the SGLang NIXL EP tests: ``nixl_ep.Buffer`` (it needs GPUs and NIXL's RDMA), from its released
Python API (ai-dynamo/nixl ``nixl_ep/buffer.py``): DeepEP's low-latency API on a buffer that joins its peers
through a TCP store.

- ``Buffer(rank, tcp_store_group, ...)``; ``update_memory_buffers(num_ranks, num_experts_per_rank, num_rdma_bytes)``
  keeps the bytes SGLang asks for; ``set_tcp_store_group``, ``connect_ranks(ranks)``, ``clean_buffer``; every buffer a process builds is in ``Buffer.built``;
- ``get_rdma_size_hint(T, hidden, num_ranks, num_experts)`` (C++ ``nixl_ep_cpp``): a stand-in formula here — the
  tests check the plugin reports what the library's function says for SGLang's arguments, not the formula;
- ``dispatch(x, topk_idx, T, num_experts, use_fp8, async_finish, return_recv_hook, round_scale, use_ue8m0)`` and
  ``combine(x, topk_idx, topk_weights, handle, async_finish, return_recv_hook)`` move the tokens as the DeepEP
  stand-in does (``deepep_standin.py``, over the gloo world), with DeepEP's assertion text, as NIXL EP's C++ has.

``install()`` puts the module where SGLang imports it from (``nixl_ep``).
"""

from __future__ import annotations

import sys
import types

import torch
import torch.distributed as dist

from tests.sglang import deepep_standin


def size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """A stand-in for NIXL EP's C++ hint: double-buffered bf16 receive slots for every expert, plus signaling."""
    return 2 * (num_experts * num_max_dispatch_tokens_per_rank * (hidden * 2 + 32) + num_ranks * 128)


class Buffer(deepep_standin.Buffer):
    built: list["Buffer"] = []

    def __init__(self, rank=0, tcp_store_group=None, **kwargs):
        super().__init__(dist.group.WORLD, 0, 0, low_latency_mode=True)
        self.tcp_store_group, self.connected = tcp_store_group, []
        Buffer.built.append(self)

    @staticmethod
    def get_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        return size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def update_memory_buffers(self, num_ranks, num_experts_per_rank, num_rdma_bytes):
        self.num_rdma_bytes = num_rdma_bytes

    def connect_ranks(self, ranks, activate=True):
        self.connected += list(ranks)

    def set_tcp_store_group(self, tcp_store_group):
        self.tcp_store_group = tcp_store_group

    def clean_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        pass

    def dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=True, async_finish=False,
                 return_recv_hook=False, round_scale=False, use_ue8m0=False, **more):
        return self.low_latency_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=use_fp8,
                                         async_finish=async_finish, return_recv_hook=return_recv_hook)

    def combine(self, x, topk_idx, topk_weights, handle, async_finish=False, return_recv_hook=False, **more):
        return self.low_latency_combine(x, topk_idx, topk_weights, handle, async_finish=async_finish,
                                        return_recv_hook=return_recv_hook)


def install() -> None:
    """``from nixl_ep import Buffer, topk_idx_t`` finds the stand-in; SGLang 0.5.19 - 0.5.20 import it with their
    own module (``Buffer``, ``use_nixl``), which a rank forked from a zygote imported before: as if it had worked."""
    module = types.ModuleType("nixl_ep")
    module.Buffer, module.topk_idx_t = Buffer, torch.int64
    sys.modules["nixl_ep"] = module
    sglang_module = sys.modules.get("sglang.srt.layers.moe.token_dispatcher.nixl")
    if sglang_module is not None and hasattr(sglang_module, "use_nixl"):
        sglang_module.Buffer, sglang_module.use_nixl = Buffer, True
