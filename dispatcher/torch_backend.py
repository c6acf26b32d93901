"""FlashInfer A2A semantics over ``torch.distributed.all_to_all_single`` (gloo on CPU, NCCL on GPU).

Runs on any cluster, no NVLink fabric needed. Every buffer has a fixed shape set by
``(ep_size, R)``, never by how many tokens go where, so a step is graph-capturable on NCCL and
never reads a device value back to the host.

One dispatch is one collective: every payload is viewed as bytes and packed side by side into a
``[ep_size, R, bytes_per_token + 1]`` buffer whose last byte flags a real row; the receiver sums
those flags into ``recv_counts``, which doubles as the count exchange. Combine is a second
collective of ``[ep_size, R, H]``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .backend import MAX_TOP_K, A2ABackend, RoutePlan, padding_rows, plan_routes


class TorchA2ABackend(A2ABackend):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("TorchA2ABackend needs an initialised torch.distributed process group")
        self.group = group
        self.ep_rank = dist.get_rank(group)
        self.ep_size = dist.get_world_size(group)
        if not 0 < top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be in 1..{MAX_TOP_K}, got {top_k}")
        if num_experts < self.ep_size:
            raise ValueError(f"num_experts ({num_experts}) must be >= ep_size ({self.ep_size})")
        self.num_experts = num_experts
        self.top_k = top_k
        if device is None:
            device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        # Updated in place so that holders of a reference (counters, graphs) stay valid.
        self._traffic = torch.zeros(2, self.ep_size, dtype=torch.int64, device=self.device)  # sent row, received row
        self._send_counts, self._recv_counts = self._traffic[0], self._traffic[1]
        self._plan: RoutePlan | None = None

    @property
    def send_counts(self) -> torch.Tensor:
        return self._send_counts

    @property
    def recv_counts(self) -> torch.Tensor:
        return self._recv_counts

    def traffic_counts(self) -> torch.Tensor:
        return self._traffic

    def _dispatch(self, token_selected_experts, payloads, runtime_max_tokens_per_rank,
                  invalid_token_expert_id, expert_id_payload_index):
        ep_size, rows = self.ep_size, runtime_max_tokens_per_rank
        plan = plan_routes(token_selected_experts, self.num_experts, ep_size, rows)
        num_tokens = token_selected_experts.shape[0]

        as_bytes = [payload.contiguous().view(torch.uint8) for payload in payloads]
        valid_flag = torch.ones(num_tokens, 1, dtype=torch.uint8, device=self.device)
        packed = torch.cat(as_bytes + [valid_flag], dim=1)  # [T, bytes_per_token + 1]
        row_bytes = packed.shape[1]

        send = torch.zeros(ep_size * rows + 1, row_bytes, dtype=torch.uint8, device=self.device)
        # Every (token, rank) pair writes one row; pairs that do not travel land on the discard row.
        send.index_copy_(
            0, plan.slot.reshape(-1),
            packed.unsqueeze(1).expand(num_tokens, ep_size, row_bytes).reshape(-1, row_bytes),
        )
        received = torch.empty(ep_size * rows, row_bytes, dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(received, send[: ep_size * rows], group=self.group)
        received = received.view(ep_size, rows, row_bytes)

        self._send_counts.copy_(plan.send_counts)
        self._recv_counts.copy_(received[:, :, -1].sum(1))
        self._plan = plan

        outputs = []
        start = 0
        for payload, payload_bytes in zip(payloads, as_bytes):
            width = payload_bytes.shape[1]
            # A fresh buffer, not .contiguous(): that may keep odd strides on size-1 dims, which
            # the dtype view rejects.
            chunk = torch.empty(ep_size, rows, width, dtype=torch.uint8, device=self.device)
            chunk = chunk.copy_(received[:, :, start : start + width]).view(payload.dtype)
            outputs.append(chunk)  # [ep_size, R, n]
            start += width
        if invalid_token_expert_id is not None:
            padding = padding_rows(self._recv_counts, rows)
            outputs[expert_id_payload_index].masked_fill_(padding.unsqueeze(-1), invalid_token_expert_id)
        return outputs

    def _combine(self, payload, runtime_max_tokens_per_rank):
        plan = self._plan
        ep_size, rows, hidden = self.ep_size, runtime_max_tokens_per_rank, payload.shape[-1]
        # One extra zero row backs the discard slot, so gathering needs no mask.
        returned = torch.zeros(ep_size * rows + 1, hidden, dtype=payload.dtype, device=self.device)
        dist.all_to_all_single(returned[: ep_size * rows], payload.reshape(ep_size * rows, hidden).contiguous(),
                               group=self.group)
        contributions = returned[plan.slot]  # [T, ep_size, H]
        self._plan = None
        # Accumulate in fp32 like the FlashInfer combine kernel, whatever the payload dtype.
        return contributions.sum(1, dtype=torch.float32).to(payload.dtype)
