"""The stand-in of the SGLang DeepEP v2 tests: ``deep_ep.ElasticBuffer`` (it needs GPUs, NCCL's device API and
DeepEP v2's C++), from its released Python API (deepseek-ai/DeepEP ``deep_ep/buffers/elastic.py``):

- ``ElasticBuffer(group, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0, hidden=0, num_topk=0,
  use_fp8_dispatch=False, ..., allow_hybrid_mode=True, ..., prefer_overlap_with_compute=True, sl_idx=3, ...)``
  keeps ``num_bytes`` as DeepEP does (its C++ ``calculate_elastic_buffer_size`` here a stand-in formula, 2 MiB
  aligned like DeepEP's: the tests compare what the plugin reports with what the buffer says, never the
  formula) and calls ``group.barrier()`` (construction is collective); every buffer a process builds is kept in
  ``ElasticBuffer.built``;
- ``dispatch(x, topk_idx, topk_weights, num_experts, num_max_tokens_per_rank, expert_alignment, num_sms,
  use_tma_aligned_col_major_sf, do_cpu_sync, do_expand)`` sends each (token, expert) pair to the expert's rank
  with ``all_to_all_single`` over the group (gloo here) and returns DeepEP's tuple ``(recv_x, recv_topk_idx,
  recv_topk_weights, handle, event)``: expanded (``do_expand``), one received row per pair with its weight and
  receiver-local expert; the handle carries ``psum_num_recv_tokens_per_expert`` and
  ``psum_num_recv_tokens_per_scaleup_rank`` (prefix sums, int32) and the routing back;
- ``combine(x, handle, topk_weights)`` returns each source token's sum of weight x its pairs' rows.

Only bf16 dispatch (FP8 needs SGLang's GPU quantization kernel). ``install(module)`` puts it on SGLang's
``token_dispatcher.deepep_v2`` module in place of the failed import.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

ALIGNMENT_BYTES = 2 << 20  # DeepEP's get_elastic_buffer_alignment()


def standin_num_bytes(num_max_tokens_per_rank: int, hidden: int, num_topk: int, num_ranks: int) -> int:
    """A stand-in for DeepEP's C++ sizing (receive slots for every rank's tokens, bf16, plus routing), 2 MiB
    aligned: the tests check the plugin reports what the buffer holds, not this formula."""
    raw = num_ranks * num_max_tokens_per_rank * (hidden * 2 + num_topk * 12) * 2
    return -(-raw // ALIGNMENT_BYTES) * ALIGNMENT_BYTES


class _Event:
    event = None  # SGLang waits only when a CUDA event is there

    def current_stream_wait(self) -> None:
        pass


class ElasticBuffer:
    built: list["ElasticBuffer"] = []

    def __init__(self, group, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0, hidden=0, num_topk=0,
                 use_fp8_dispatch=False, deterministic=False, allow_hybrid_mode=True, allow_multiple_reduction=True,
                 prefer_overlap_with_compute=True, sl_idx=3, num_allocated_qps=0, num_cpu_timeout_secs=300,
                 num_gpu_timeout_secs=100, explicitly_destroy=False):
        self.group, self.rank_idx, self.num_ranks = group, group.rank(), group.size()
        if num_bytes is None:
            num_bytes = standin_num_bytes(num_max_tokens_per_rank, hidden, num_topk, self.num_ranks)
        self.num_bytes = num_bytes
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.hidden, self.num_topk, self.use_fp8_dispatch = hidden, num_topk, use_fp8_dispatch
        self.allow_hybrid_mode = allow_hybrid_mode
        ElasticBuffer.built.append(self)
        group.barrier()  # collective construction, as DeepEP's

    def dispatch(self, x, topk_idx, topk_weights=None, num_experts=0, num_max_tokens_per_rank=0,
                 expert_alignment=128, num_sms=0, use_tma_aligned_col_major_sf=False, do_cpu_sync=True,
                 do_expand=False):
        if isinstance(x, tuple):
            raise NotImplementedError("the stand-in moves bf16 tokens only")
        ranks, local = self.num_ranks, num_experts // self.num_ranks
        if x.shape[0] > num_max_tokens_per_rank:  # DeepEP's own check (SGLang's ValueError comes first)
            raise RuntimeError(f"EP_HOST_ASSERT: num_tokens {x.shape[0]} <= num_max_tokens_per_rank "
                               f"{num_max_tokens_per_rank}")
        token, slot = torch.nonzero(topk_idx >= 0, as_tuple=True)
        expert = topk_idx[token, slot]
        destination = expert // local
        order = torch.argsort(destination, stable=True)
        token, slot, expert, destination = token[order], slot[order], expert[order], destination[order]
        send_counts = torch.bincount(destination, minlength=ranks)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
        rows = int(recv_counts.sum())

        def exchange(tensor):
            out = tensor.new_empty((rows, *tensor.shape[1:]))
            dist.all_to_all_single(out, tensor.contiguous(), recv_splits, send_splits, group=self.group)
            return out

        recv_x = exchange(x[token])
        recv_expert = exchange(expert) - self.rank_idx * local
        recv_weights = exchange(topk_weights[token, slot].float())
        per_expert = torch.bincount(recv_expert, minlength=local)
        handle = SimpleNamespace(
            psum_num_recv_tokens_per_expert=torch.cumsum(per_expert, 0).to(torch.int32),
            psum_num_recv_tokens_per_scaleup_rank=torch.cumsum(recv_counts, 0).to(torch.int32),
            token=token, send_splits=send_splits, recv_splits=recv_splits, num_tokens=x.shape[0])
        return recv_x, recv_expert, recv_weights, handle, _Event()

    def combine(self, x, handle=None, topk_weights=None):
        weighted = x.float() * topk_weights.float().unsqueeze(1)
        back = weighted.new_empty((sum(handle.send_splits), x.shape[1]))
        dist.all_to_all_single(back, weighted.contiguous(), handle.send_splits, handle.recv_splits, group=self.group)
        combined = back.new_zeros((handle.num_tokens, x.shape[1])).index_add_(0, handle.token, back)
        return combined.to(x.dtype), None, _Event()


def install(module) -> None:
    """The stand-in as if ``from deep_ep import ElasticBuffer`` had worked in SGLang's module."""
    module.ElasticBuffer = ElasticBuffer
    module.use_deepep_v2 = True
    module._deepep_v2_import_error = None
