"""The send/recv counts of the FlashInfer adapters, on CPU: the one implementation both adapters keep
(``dispatch_counts``) over workspaces laid out by ``capwatch.sizing``, and the legacy adapter adopting a
``MoeAlltoAll`` in a real gloo group with either counter source. The one stand-in is FlashInfer's
``MoeAlltoAll`` itself (``tests/sglang/standin.py``: it moves tokens over gloo and writes the counter words
where FlashInfer's kernel does); the GPU runs of both adapters are ``tests/dispatcher/test_gpu.py``."""

from __future__ import annotations

import pytest
import torch
from capwatch.dispatcher.backend import compute_target_rank_id
from capwatch.dispatcher.flashinfer_backend import (
    LEGACY_METAINFO_INDEX,
    DerivedCounts,
    ParityBankedWorkspaceCounts,
    WorkspaceCounts,
    dispatch_counts,
)
from capwatch.sizing.flashinfer_moe_a2a import workspace_layout
from hypothesis import given, settings
from hypothesis import strategies as st

from capwatch.demo.ranks import spawn_ranks

from .moe import INVALID_EXPERT_ID, MoECase, expected_send_counts, expert_fn, make_inputs, reference_outputs

EP_SIZE = 4
LAYOUT = workspace_layout(EP_SIZE, 64, 1024, 512, flashinfer_version="0.7.2.post1")


def rank_bytes() -> torch.Tensor:
    return torch.zeros(LAYOUT.workspace_bytes_per_rank, dtype=torch.uint8)


def words(workspace: torch.Tensor, offset: int, count: int) -> torch.Tensor:
    return workspace[offset : offset + 4 * count].view(torch.int32)


def test_workspace_counts_read_the_counter_words_of_every_round():
    workspace = rank_bytes()
    counts = WorkspaceCounts(workspace, LAYOUT.metainfo, LEGACY_METAINFO_INDEX, EP_SIZE)
    for round_ in range(3):  # the kernel rewrites the words in place each dispatch; the views follow
        words(workspace, LAYOUT.send_counters_offset, EP_SIZE).copy_(torch.tensor([1, 2, 3, 4]) * (round_ + 1))
        words(workspace, LAYOUT.recv_counters_offset, EP_SIZE).copy_(torch.tensor([5, 0, 7, 1]) + round_)
        assert counts.send.tolist() == [(round_ + 1) * n for n in (1, 2, 3, 4)]
        assert counts.recv.tolist() == [5 + round_, round_, 7 + round_, 1 + round_]
    assert counts.send.data_ptr() == words(workspace, LAYOUT.send_counters_offset, EP_SIZE).data_ptr()


@settings(max_examples=200, deadline=None)
@given(flag=st.integers(0, 2**32 - 1), banks=st.lists(st.integers(0, 2**31 - 1), min_size=2 * EP_SIZE,
                                                      max_size=2 * EP_SIZE))
def test_parity_banked_counts_pick_the_rounds_bank_for_any_flag(flag, banks):
    """0.7.4: the round's bank is ((flag_val - 1) >> 1) & 1 in uint32 arithmetic, whatever the flag."""
    index = {"FLAG_VAL_OFFSET_INDEX": 0, "SEND_COUNTERS_OFFSET_INDEX": 2, "RECV_COUNTERS_OFFSET_INDEX": 3}
    metainfo = [0, 0, 8, 8 + 4 * EP_SIZE]
    workspace = torch.zeros(8 + 4 * 3 * EP_SIZE, dtype=torch.uint8)
    words(workspace, 0, 1).copy_(torch.tensor([flag], dtype=torch.int64).to(torch.int32))  # the uint32's bits
    words(workspace, metainfo[3], 2 * EP_SIZE).copy_(torch.tensor(banks, dtype=torch.int32))
    counts = ParityBankedWorkspaceCounts(workspace, metainfo, index, EP_SIZE)
    bank = (((flag - 1) % 2**32) >> 1) & 1
    assert counts.recv.tolist() == banks[bank * EP_SIZE : (bank + 1) * EP_SIZE]


def test_derived_counts_follow_the_routing_and_the_received_rows():
    case = MoECase(seed=5, tokens_per_rank=(7, 3, 0, 5), num_experts=10, top_k=3, hidden=4)
    ids = make_inputs(case).experts[0]
    rows = case.runtime_max_tokens_per_rank
    counts = DerivedCounts(EP_SIZE, torch.device("cpu"))
    received = torch.full((EP_SIZE, rows, case.top_k), INVALID_EXPERT_ID, dtype=torch.int32)
    for source, tokens in enumerate((4, 0, 7, 1)):
        received[source, :tokens] = source  # rows carrying a token hold at least one valid id
    received[2, 3, 1:] = INVALID_EXPERT_ID  # a row with one valid slot still carries its token
    counts.record(ids, case.num_experts, rows, received, INVALID_EXPERT_ID)
    targets = compute_target_rank_id(ids.long(), case.num_experts, EP_SIZE)
    assert counts.send.tolist() == [sum(int((row == rank).any()) for row in targets) for rank in range(EP_SIZE)]
    assert counts.recv.tolist() == [4, 0, 7, 1]


def test_an_unknown_counter_source_is_refused_before_the_workspace_is_read():
    def workspace():
        raise AssertionError("the workspace views were made for an unknown source")

    with pytest.raises(ValueError, match="counters_source must be one of"):
        dispatch_counts("kernel", EP_SIZE, torch.device("cpu"), workspace)
    assert isinstance(dispatch_counts("derived", EP_SIZE, torch.device("cpu"), workspace), DerivedCounts)


# --- the legacy adapter, adopting a MoeAlltoAll in a gloo group --------------------------------------

CASE = MoECase(seed=17, tokens_per_rank=(5, 0, 6), num_experts=7, top_k=3, hidden=8)


def adopted_step(rank: int, world_size: int, case: MoECase) -> dict:
    """One instrumented MoE step per counter source through ``FlashInferMoeAlltoAllBackend.adopt``."""
    from types import SimpleNamespace

    from capwatch.dispatcher.counters import DispatchCounters
    from capwatch.dispatcher.flashinfer_backend import FlashInferMoeAlltoAllBackend
    from capwatch.dispatcher.instrumented import InstrumentedDispatcher

    from tests.sglang.standin import TorchMoeAlltoAll, moe_a2a_get_workspace_size_per_rank

    inputs = make_inputs(case)
    ids, x, weights = inputs.experts[rank], inputs.hidden_states[rank], inputs.router_weights[rank]
    rows = case.runtime_max_tokens_per_rank
    results = {}
    for source in ("workspace", "derived"):
        alltoall = TorchMoeAlltoAll(
            SimpleNamespace(moe_ep_size=world_size, moe_ep_rank=rank), rows, case.top_k, case.num_experts,
            workspace_size_per_rank=moe_a2a_get_workspace_size_per_rank(world_size, rows, 64, 32),
            mnnvl_config=SimpleNamespace(comm_backend=SimpleNamespace(_group=None)))
        backend = FlashInferMoeAlltoAllBackend.adopt(alltoall, counters_source=source)
        counters = DispatchCounters(rows, world_size)
        output = InstrumentedDispatcher(backend, counters, rows).run(
            ids, [x, ids, weights], rows, expert_fn(rank, case, inputs.expert_weights), INVALID_EXPERT_ID, 1)
        snapshot = counters.snapshot()
        results[source] = {"output": output, "sent": list(snapshot.tokens_sent_per_rank),
                           "received": list(snapshot.tokens_received_per_rank)}
    return results


def test_the_adopted_legacy_adapter_counts_the_same_with_either_source():
    results = spawn_ranks(CASE.ep_size, adopted_step, CASE, timeout_s=180)
    inputs = make_inputs(CASE)
    expected = expected_send_counts(CASE, inputs)
    reference = reference_outputs(CASE, inputs)
    for rank, by_source in enumerate(results):
        for source, result in by_source.items():
            assert result["sent"] == expected[rank].tolist(), (rank, source)
            assert result["received"] == expected[:, rank].tolist(), (rank, source)
            torch.testing.assert_close(result["output"], reference[rank], rtol=1e-5, atol=1e-5)
