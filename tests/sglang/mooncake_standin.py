"""The stand-in of the SGLang Mooncake EP tests: ``mooncake.mooncake_ep_buffer.Buffer`` (it needs GPUs, RDMA and
the Mooncake process group), from its released Python API (kvcache-ai/Mooncake
``mooncake-wheel/mooncake/mooncake_ep_buffer.py``): DeepEP's low-latency API with ``active_ranks`` and a timeout.

- ``Buffer(group, num_ep_buffer_bytes=0)`` keeps the bytes SGLang asks for; every buffer a process builds is kept
  in ``Buffer.built``;
- ``get_ep_buffer_size_hint(T, hidden, num_ranks, num_experts)`` (C++ ``mooncake.ep`` in the package): a stand-in
  formula here — the tests check the plugin reports what the library's function says for SGLang's arguments, not
  the formula;
- ``dispatch(x, topk_idx, active_ranks, T, num_experts, timeout_us, use_fp8, async_finish, return_recv_hook)`` and
  ``combine(x, topk_idx, topk_weights, active_ranks, timeout_us, handle, async_finish, return_recv_hook)`` move the
  tokens as the DeepEP stand-in does (``deepep_standin.py``, over gloo), its assertion worded as Mooncake's.

``install()`` puts the module where SGLang imports it from (``mooncake.mooncake_ep_buffer``).
"""

from __future__ import annotations

import sys
import types

from tests.sglang import deepep_standin

MOONCAKE_ASSERT = "Mooncake EP: x.size(0) <= num_max_dispatch_tokens_per_rank"


def size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """A stand-in for Mooncake EP's C++ hint: double-buffered bf16 receive slots for every expert, plus signaling."""
    return 2 * (num_experts * num_max_dispatch_tokens_per_rank * (hidden * 2 + 16) + num_ranks * 64)


class Buffer(deepep_standin.Buffer):
    built: list["Buffer"] = []

    def __init__(self, group, num_ep_buffer_bytes: int = 0):
        super().__init__(group, 0, num_ep_buffer_bytes, low_latency_mode=True)
        self.num_ep_buffer_bytes = num_ep_buffer_bytes
        Buffer.built.append(self)

    @staticmethod
    def get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        return size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def dispatch(self, x, topk_idx, active_ranks, num_max_dispatch_tokens_per_rank, num_experts, timeout_us,
                 use_fp8=True, async_finish=False, return_recv_hook=False):
        if x.size(0) > num_max_dispatch_tokens_per_rank:
            raise RuntimeError(MOONCAKE_ASSERT)
        return self.low_latency_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                                         use_fp8=use_fp8, async_finish=async_finish,
                                         return_recv_hook=return_recv_hook)

    def combine(self, x, topk_idx, topk_weights, active_ranks, timeout_us, handle, async_finish=False,
                return_recv_hook=False):
        return self.low_latency_combine(x, topk_idx, topk_weights, handle, async_finish=async_finish,
                                        return_recv_hook=return_recv_hook)


def install() -> None:
    """``from mooncake.mooncake_ep_buffer import Buffer`` finds the stand-in."""
    package, module = types.ModuleType("mooncake"), types.ModuleType("mooncake.mooncake_ep_buffer")
    module.Buffer, package.mooncake_ep_buffer = Buffer, module
    sys.modules["mooncake"], sys.modules["mooncake.mooncake_ep_buffer"] = package, module
