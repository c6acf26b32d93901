"""A small random MoE layer, computed two ways: by one process (the reference) and by EP ranks
through a dispatcher (each rank evaluates only its own experts on what it received)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from capwatch.dispatcher.backend import compute_target_rank_id, local_expert_range

INVALID_EXPERT_ID = -1


@dataclass(frozen=True)
class MoECase:
    seed: int
    tokens_per_rank: tuple[int, ...]  # local batch of each rank; may contain 0
    num_experts: int
    top_k: int
    hidden: int
    dtype: torch.dtype = torch.float32

    @property
    def ep_size(self) -> int:
        return len(self.tokens_per_rank)

    @property
    def runtime_max_tokens_per_rank(self) -> int:
        return max(max(self.tokens_per_rank), 1)


@dataclass
class MoEInputs:
    experts: list[torch.Tensor]  # per rank int32 [T_r, top_k]
    hidden_states: list[torch.Tensor]  # per rank [T_r, H]
    router_weights: list[torch.Tensor]  # per rank fp32 [T_r, top_k]
    expert_weights: torch.Tensor  # fp32 [E, H, H]


def make_inputs(case: MoECase) -> MoEInputs:
    """Same values on every process for the same case (seeded CPU generator)."""
    generator = torch.Generator().manual_seed(case.seed)
    experts, hidden_states, router_weights = [], [], []
    for tokens in case.tokens_per_rank:
        ids = torch.randint(0, case.num_experts, (tokens, case.top_k), generator=generator, dtype=torch.int32)
        if tokens >= 2 and case.top_k >= 2:
            ids[0, :] = ids[0, 0]  # every top-k slot on one expert
            ids[1, 1] = min(ids[1, 0].item() + 1, case.num_experts - 1)  # two slots, likely one rank
        experts.append(ids)
        hidden_states.append(torch.randn(tokens, case.hidden, generator=generator).to(case.dtype))
        router_weights.append(torch.rand(tokens, case.top_k, generator=generator))
    expert_weights = torch.randn(case.num_experts, case.hidden, case.hidden, generator=generator) / case.hidden**0.5
    return MoEInputs(experts, hidden_states, router_weights, expert_weights)


def reference_outputs(case: MoECase, inputs: MoEInputs) -> list[torch.Tensor]:
    outputs = []
    for ids, x, weights in zip(inputs.experts, inputs.hidden_states, inputs.router_weights):
        per_slot = torch.einsum("th,tkhg->tkg", x.float(), inputs.expert_weights[ids.long()])
        outputs.append((weights.unsqueeze(-1) * per_slot).sum(1).to(case.dtype))
    return outputs


def expert_fn(rank: int, case: MoECase, expert_weights: torch.Tensor):
    """What rank ``rank`` computes on received ``[x, ids, weights]``: its own experts only."""
    local = local_expert_range(rank, case.num_experts, case.ep_size)

    def compute(received: list[torch.Tensor]) -> torch.Tensor:
        x, ids, weights = received
        out = torch.zeros(x.shape[:2] + (case.hidden,), dtype=torch.float32, device=x.device)
        weights_here = expert_weights.to(x.device)
        for expert in local:
            coefficient = (weights * (ids == expert)).sum(-1, keepdim=True)  # [ep, R, 1]
            out += coefficient * (x.float() @ weights_here[expert])
        return out.to(case.dtype)

    return compute


def expected_received(case: MoECase, inputs: MoEInputs, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden rows [ep, R, H], token counts [ep]) rank ``rank`` must receive, in local-index order."""
    rows = case.runtime_max_tokens_per_rank
    received = torch.zeros(case.ep_size, rows, case.hidden, dtype=case.dtype)
    counts = torch.zeros(case.ep_size, dtype=torch.int64)
    for source, (ids, x) in enumerate(zip(inputs.experts, inputs.hidden_states)):
        targets = compute_target_rank_id(ids.long(), case.num_experts, case.ep_size)
        for token in range(ids.shape[0]):
            if (targets[token] == rank).any():
                received[source, counts[source]] = x[token]
                counts[source] += 1
    return received, counts


def expected_send_counts(case: MoECase, inputs: MoEInputs) -> torch.Tensor:
    """[ep, ep]: tokens rank i sends to rank j (one per token and target rank)."""
    counts = torch.zeros(case.ep_size, case.ep_size, dtype=torch.int64)
    for source, ids in enumerate(inputs.experts):
        targets = compute_target_rank_id(ids.long(), case.num_experts, case.ep_size)
        for token in range(ids.shape[0]):
            for target in set(targets[token].tolist()):
                counts[source, target] += 1
    return counts
