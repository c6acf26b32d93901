"""The one stand-in of the SGLang tests: FlashInfer's ``MoeAlltoAll`` (MNNVL needs GPUs).

``TorchMoeAlltoAll`` keeps ``flashinfer.comm.MoeAlltoAll``'s constructor, ``dispatch``, ``combine``
and ``get_combine_payload_tensor_in_workspace`` contract and moves the tokens with capwatch's
``TorchA2ABackend`` (torch.distributed, gloo here). Like FlashInfer it keeps one process-wide
workspace per (size, rank, ep_size, max tokens), shaped ``uint8 [ep_size, workspace_size_per_rank]``
with FlashInfer's layout, so the layers of one namespace share it; after each dispatch it writes this
rank's send and receive counters into the workspace words at the metainfo offsets, as FlashInfer's
kernel does. The workspace size function is capwatch's exact formula (``capwatch.sizing.flashinfer_moe_a2a``).

``install(module)`` puts both on SGLang's ``token_dispatcher.flashinfer`` module, where
``FlashinferDispatcher`` looks them up at construction.
"""

from __future__ import annotations

import importlib.metadata

import torch
from capwatch.dispatcher.torch_backend import TorchA2ABackend
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank, workspace_layout

FLASHINFER_VERSION = importlib.metadata.version("flashinfer-python")  # the release's pin, from its folder


def moe_a2a_get_workspace_size_per_rank(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                                        combine_payload_size_per_token, eplb_stats_num_experts=0, **_backend):
    return workspace_bytes_per_rank(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                                           combine_payload_size_per_token, eplb_stats_num_experts, FLASHINFER_VERSION)


class TorchMoeAlltoAll:
    _WORKSPACE_CACHE: dict[tuple[int, int, int, int, int], dict] = {}

    def __init__(self, mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank=None, hidden_size=None,
                 mnnvl_config=None, eplb_stats_num_experts=0, enable_rank_mask=False, *, backend="trtllm"):
        if workspace_size_per_rank is None:
            raise NotImplementedError("the stand-in sizes its workspace from workspace_size_per_rank only")
        group = mnnvl_config.comm_backend._group  # SGLang's TorchDistributedCommBackend(group)
        self.ep_size, self.ep_rank = mapping.moe_ep_size, mapping.moe_ep_rank
        self.max_num_tokens, self.top_k, self.num_experts = max_num_tokens, top_k, num_experts
        self.workspace_size_per_rank = workspace_size_per_rank
        key = (workspace_size_per_rank, self.ep_rank, self.ep_size, max_num_tokens, eplb_stats_num_experts)
        entry = self._WORKSPACE_CACHE.get(key)
        if entry is None:
            entry = self._WORKSPACE_CACHE[key] = {
                "workspace": torch.zeros(self.ep_size, workspace_size_per_rank, dtype=torch.uint8),
                "backend": TorchA2ABackend(num_experts, top_k, group=group, device="cpu"),
            }
        self.workspace = entry["workspace"]
        self._backend = entry["backend"]
        # FlashInfer's metainfo (byte offsets of the flag, the counters, ...) by capwatch's layout of that release;
        # the counter offsets do not depend on the payload sizes.
        layout = workspace_layout(self.ep_size, max_num_tokens, 1, 1, eplb_stats_num_experts, FLASHINFER_VERSION)
        self.metainfo = torch.tensor(layout.metainfo, dtype=torch.int64)
        send, recv = layout.send_counters_offset, layout.recv_counters_offset
        self._send_words = self.workspace[self.ep_rank, send : send + 4 * self.ep_size].view(torch.int32)
        self._recv_words = self.workspace[self.ep_rank, recv : recv + 4 * self.ep_size].view(torch.int32)
        self._combine_payload = None
        self._runtime_tokens = None

    def dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                 invalid_token_expert_id=None, expert_id_payload_index=None, eplb_local_stats=None,
                 active_rank_mask=None):
        assert self._runtime_tokens is None, "dispatch called twice without combine"
        assert runtime_max_tokens_per_rank <= self.max_num_tokens, "runtime_max_tokens_per_rank exceeds max_num_tokens"
        if runtime_max_tokens_per_rank == 0:  # idle on every rank (R is group-wide): nothing travels
            received = [payload.new_empty(self.ep_size, 0, payload.shape[1]) for payload in input_payloads]
            self._send_words.zero_()
            self._recv_words.zero_()
        else:
            received = self._backend.dispatch(token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                                              invalid_token_expert_id, expert_id_payload_index)
            self._send_words.copy_(self._backend.send_counts)
            self._recv_words.copy_(self._backend.recv_counts)
        self._runtime_tokens = runtime_max_tokens_per_rank
        return received

    def get_combine_payload_tensor_in_workspace(self, runtime_max_tokens_per_rank, hidden_size, dtype):
        if self._runtime_tokens is None:
            raise RuntimeError("get_combine_payload_tensor_in_workspace called before successful dispatch")
        self._combine_payload = torch.empty(self.ep_size, runtime_max_tokens_per_rank, hidden_size, dtype=dtype)
        return self._combine_payload

    def combine(self, payload, runtime_max_tokens_per_rank, payload_in_workspace=False, output_dtype=None, **_more):
        assert self._runtime_tokens is not None, "combine called before successful dispatch"
        if payload_in_workspace:
            payload = self._combine_payload  # [ep_size, R, H], written by the experts
        if runtime_max_tokens_per_rank == 0:
            output = payload.new_empty(0, payload.shape[-1])
        else:
            output = self._backend.combine(payload, runtime_max_tokens_per_rank)
        self._runtime_tokens = self._combine_payload = None
        return output


def install(module) -> None:
    """Replace FlashInfer's MoeAlltoAll and workspace formula on sglang's flashinfer dispatcher module."""
    module.MoeAlltoAll = TorchMoeAlltoAll
    module.moe_a2a_get_workspace_size_per_rank = moe_a2a_get_workspace_size_per_rank
