"""FlashInfer's contiguous expert -> rank mapping and the routing plan (single process)."""

from __future__ import annotations

import pytest
import torch

from capwatch.dispatcher.backend import (
    compute_target_rank_id, local_expert_range, padding_rows, plan_routes, validate_dispatch_inputs,
)


def flashinfer_formula(expert: int, num_experts: int, ep_size: int) -> int:
    """compute_target_rank_id as written in FlashInfer's kernel, one expert at a time."""
    base, remainder = divmod(num_experts, ep_size)
    if remainder == 0:
        return expert // base
    if expert < remainder * (base + 1):
        return expert // (base + 1)
    return remainder + (expert - remainder * (base + 1)) // base


@pytest.mark.parametrize("num_experts", [1, 2, 3, 7, 8, 10, 61, 64, 256, 257, 384])
@pytest.mark.parametrize("ep_size", [1, 2, 3, 4, 7, 8, 64])
def test_target_rank_matches_flashinfer_and_owned_ranges(num_experts, ep_size):
    if num_experts < ep_size:
        with pytest.raises(ValueError, match="must be >= ep_size"):
            compute_target_rank_id(torch.arange(num_experts), num_experts, ep_size)
        return
    experts = torch.arange(num_experts)
    ranks = compute_target_rank_id(experts, num_experts, ep_size)
    assert ranks.tolist() == [flashinfer_formula(e, num_experts, ep_size) for e in range(num_experts)]
    owned = [local_expert_range(rank, num_experts, ep_size) for rank in range(ep_size)]
    assert [e for block in owned for e in block] == list(range(num_experts))  # contiguous, in order
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    for rank, block in enumerate(owned):
        assert all(ranks[e] == rank for e in block)


def test_non_divisible_example():
    # 10 experts on 4 ranks: the first 10 % 4 = 2 ranks own 3 experts, the others 2.
    assert compute_target_rank_id(torch.arange(10), 10, 4).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]


def test_plan_sends_each_token_once_per_rank_in_local_order():
    experts = torch.tensor([[0, 1], [3, 3], [9, 0], [8, 9]], dtype=torch.int32)  # 10 experts, 4 ranks
    plan = plan_routes(experts, 10, 4, runtime_max_tokens_per_rank=4)
    discard = 16
    # token 0 -> rank 0 (two slots there, one copy); token 2 -> ranks 0 and 3; token 3 -> rank 3 once.
    assert plan.slot.tolist() == [
        [0, discard, discard, discard],
        [discard, 4, discard, discard],
        [1, discard, discard, 12],
        [discard, discard, discard, 13],
    ]
    assert plan.send_counts.tolist() == [2, 1, 0, 2]
    assert plan.discard_row == discard


def test_plan_of_an_empty_batch():
    plan = plan_routes(torch.zeros(0, 3, dtype=torch.int32), 5, 2, runtime_max_tokens_per_rank=1)
    assert plan.slot.shape == (0, 2) and plan.send_counts.tolist() == [0, 0]


def test_padding_rows():
    assert padding_rows(torch.tensor([0, 2, 3]), 3).tolist() == [
        [True, True, True], [False, False, True], [False, False, False]
    ]


def test_local_expert_range_rejects_a_rank_outside_the_group():
    with pytest.raises(ValueError, match="outside"):
        local_expert_range(4, 10, 4)


def test_the_contract_refuses_more_local_tokens_than_runtime_rows():
    ids = torch.zeros(3, 2, dtype=torch.int32)
    payloads = [torch.zeros(3, 4)]
    validate_dispatch_inputs(ids, payloads, 3, 2, None, None)  # T == R is fine
    with pytest.raises(ValueError, match="3 local tokens but runtime_max_tokens_per_rank is 2.*overwrite"):
        validate_dispatch_inputs(ids, payloads, 2, 2, None, None)
