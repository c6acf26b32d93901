"""The stand-in of the SGLang DeepEP tests: ``deep_ep.Buffer`` (its low-latency mode needs GPUs and NVSHMEM).

``Buffer`` keeps the contract SGLang's ``token_dispatcher/deepep.py`` relies on (sgl-deep-ep 0.1.2.post1,
``deep_ep/buffers/legacy.py`` and the C++ behind it) and moves the tokens with ``all_to_all_single`` over the
process group (gloo here):

- the constructor records what SGLang asks for (``num_nvl_bytes``, ``num_rdma_bytes``, low-latency mode) and reads
  ``NVSHMEM_QP_DEPTH`` as DeepEP does; every buffer a process builds is kept in ``Buffer.built``;
- ``low_latency_dispatch`` checks what DeepEP checks — ``nvshmem_qp_depth >= 2(T + 1)`` (Python) and
  ``x.size(0) <= num_max_dispatch_tokens_per_rank`` (C++ ``EP_HOST_ASSERT``, raised as DeepEP raises it: a
  ``RuntimeError`` naming ``csrc/legacy/buffer.hpp``) — then sends each (token, expert) pair to the expert's rank
  and returns DeepEP's shapes: ``packed_recv_x [local experts, ranks * T, H]`` (bf16, or fp8 with fp32 scales per
  128 channels), ``packed_recv_count [local experts]`` int32, a handle (its second item DeepEP's
  ``packed_recv_layout_range``: per local expert and source rank, (rows << 32) | first slot), an event and a
  receive hook;
- ``low_latency_combine`` returns each token's sum over its experts of weight x the expert's output row;
- the size hints are capwatch's (``capwatch.sizing.deepep_*``, checked against the compiled DeepEP in
  ``tests/sizing/test_against_deepep.py``) and the normal-mode config tables DeepEP's.

``install(module)`` puts it on SGLang's ``token_dispatcher.deepep`` module in place of the failed import.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from capwatch.sizing.deepep_low_latency import low_latency_rdma_bytes
from capwatch.sizing.deepep_normal import (
    COMBINE_CONFIGS,
    DEFAULT_NUM_SMS,
    DISPATCH_CONFIGS,
    NormalConfig,
    nvl_buffer_bytes,
    rdma_buffer_bytes,
)

DEEPEP_ASSERT = "Assertion exception (csrc/legacy/buffer.hpp:1481): x.size(0) == topk_idx.size(0) and " \
                "x.size(0) <= num_max_dispatch_tokens_per_rank"
FP8_MAX = 448.0
CHANNELS_PER_SCALE = 128


class Config:
    """``deep_ep.Config``: the normal-mode buffer hints."""

    def __init__(self, num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv):
        self.config = NormalConfig.of(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        return nvl_buffer_bytes(self.config, hidden_bytes, num_ranks)

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        return rdma_buffer_bytes(self.config, hidden_bytes, num_ranks)


class EventOverlap:
    def current_stream_wait(self) -> None:  # the data is already there: the collectives are synchronous on CPU
        pass


class Buffer:
    num_sms: int = DEFAULT_NUM_SMS
    built: list[Buffer] = []

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, use_fabric=None,
                 explicitly_destroy=False, enable_shrink=False, comm=None):
        self.group, self.rank, self.group_size = group, dist.get_rank(group), dist.get_world_size(group)
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode, self.num_qps_per_rank = low_latency_mode, num_qps_per_rank
        if low_latency_mode:  # what DeepEP's constructor sets and reads
            self.nvshmem_qp_depth = int(os.environ.get("NVSHMEM_QP_DEPTH", "1024"))
        Buffer.built.append(self)

    # --- DeepEP's static helpers -------------------------------------------------------------------------

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        return low_latency_rdma_bytes(num_max_dispatch_tokens_per_rank, hidden, num_experts)

    @staticmethod
    def get_dispatch_config(num_ranks):
        assert num_ranks in DISPATCH_CONFIGS, f"Unsupported number of EP ranks: {num_ranks}"
        return Config(Buffer.num_sms, *DISPATCH_CONFIGS[num_ranks])

    @staticmethod
    def get_combine_config(num_ranks):
        assert num_ranks in COMBINE_CONFIGS, f"Unsupported number of EP ranks: {num_ranks}"
        return Config(Buffer.num_sms, *COMBINE_CONFIGS[num_ranks])

    @staticmethod
    def capture():
        return EventOverlap()

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        pass

    # --- low-latency dispatch and combine ----------------------------------------------------------------

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             x_global_scale=None, use_fp8=True, round_scale=False, use_ue8m0=False, use_nvfp4=False,
                             async_finish=False, return_recv_hook=False):
        cap = num_max_dispatch_tokens_per_rank
        assert self.nvshmem_qp_depth >= (cap + 1) * 2  # DeepEP's Python check
        if not (x.size(0) == topk_idx.size(0) and x.size(0) <= cap):
            raise RuntimeError(DEEPEP_ASSERT)
        if num_experts % self.group_size:
            raise RuntimeError("Assertion exception (csrc/legacy/buffer.hpp:1483): num_experts % num_ranks == 0")
        ranks, local = self.group_size, num_experts // self.group_size
        hidden = x.size(1)
        # One slot per (destination rank, its local expert, source token): every (token, expert) pair travels.
        send = torch.zeros(ranks, local, cap, hidden + 1, dtype=torch.float32)
        for token, experts in enumerate(topk_idx.tolist()):
            for expert in experts:
                if expert >= 0:
                    send[expert // local, expert % local, token, :hidden] = x[token].float()
                    send[expert // local, expert % local, token, hidden] = 1.0
        received = torch.empty_like(send)
        dist.all_to_all_single(received.view(ranks, -1), send.view(ranks, -1), group=self.group)
        # received[source rank, local expert, source token]: pack each local expert's rows, source by source.
        packed = torch.zeros(local, ranks * cap, hidden, dtype=torch.float32)
        source = torch.full((local, ranks * cap, 2), -1, dtype=torch.int64)  # (rank, token) of each packed row
        counts = torch.zeros(local, dtype=torch.int32)
        # DeepEP's packed_recv_layout_range [local experts, ranks]: (rows from that rank << 32) | their first slot.
        layout = torch.zeros(local, ranks, dtype=torch.int64)
        for expert in range(local):
            rows = (received[:, expert, :, hidden] > 0).nonzero().tolist()
            for slot, (rank, token) in enumerate(rows):
                packed[expert, slot] = received[rank, expert, token, :hidden]
                source[expert, slot] = torch.tensor([rank, token])
            counts[expert] = len(rows)
            begin = 0
            for rank in range(ranks):
                from_rank = sum(1 for row_rank, _ in rows if row_rank == rank)
                layout[expert, rank] = (from_rank << 32) | begin
                begin += from_rank
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats.add_(counts)
        recv = packed.to(torch.bfloat16), None
        if use_fp8:
            recv = _fp8(packed)
        handle = (source, layout, cap, hidden, num_experts)
        hook = (lambda: None) if return_recv_hook else None
        return (recv if use_fp8 else recv[0]), counts, handle, EventOverlap(), hook

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False, zero_copy=False,
                            async_finish=False, return_recv_hook=False, out=None, **overlap):
        source, _, cap, hidden, num_experts = handle
        if x.size(1) != self.group_size * cap:
            raise RuntimeError("Assertion exception (csrc/legacy/buffer.hpp): x.size(1) == num_ranks * "
                               "num_max_dispatch_tokens_per_rank")
        ranks, local = self.group_size, num_experts // self.group_size
        back = torch.zeros(ranks, local, cap, hidden, dtype=torch.float32)
        for expert in range(local):
            for slot, (rank, token) in enumerate(source[expert].tolist()):
                if rank >= 0:
                    back[rank, expert, token] = x[expert, slot].float()
        returned = torch.empty_like(back)
        dist.all_to_all_single(returned.view(ranks, -1), back.view(ranks, -1), group=self.group)
        combined = torch.zeros(topk_idx.size(0), hidden, dtype=torch.float32)
        for token, (experts, weights) in enumerate(zip(topk_idx.tolist(), topk_weights.float().tolist())):
            for expert, weight in zip(experts, weights):
                if expert >= 0:
                    combined[token] += weight * returned[expert // local, expert % local, token]
        hook = (lambda: None) if return_recv_hook else None
        return combined.to(torch.bfloat16), EventOverlap(), hook


def _fp8(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepEP's FP8 cast: e4m3 values with one fp32 scale per 128 channels."""
    blocks = rows.unflatten(-1, (-1, CHANNELS_PER_SCALE))
    scales = blocks.abs().amax(-1).clamp(min=1e-4) / FP8_MAX
    values = (blocks / scales.unsqueeze(-1)).to(torch.float8_e4m3fn).flatten(-2)
    return values, scales


def dequantized(hidden_states, scales) -> torch.Tensor:
    """The expert stand-in's view of what arrived: bf16 as is, FP8 times its scales."""
    if scales is None:
        return hidden_states.float()
    return (hidden_states.float().unflatten(-1, (-1, CHANNELS_PER_SCALE)) * scales.unsqueeze(-1)).flatten(-2)


def install(module) -> None:
    """Put the stand-in on SGLang's deepep dispatcher module, as if ``from deep_ep import Buffer, Config`` worked."""
    module.Buffer, module.Config = Buffer, Config
    module.use_deepep, module._deepep_import_error = True, None
