"""The FlashInfer and DeepEP hooks' counting dispatch, per call, in the main venv: exactly the torch ops its module
docstring promises (on CPU a ``copy_`` of the workspace's int32 counter words into the layer's int64 record and
one ``add_`` of it; eagerly the call and the step are counted on the host, and under CUDA graph capture they are
device ops: the call in the record, one ``add_`` more on the step leader), nothing allocated, nothing read back to
the host, and the counts land. "captured" drives the counters' device path on CPU (``DispatchCounters._eager``),
as a capture on CUDA takes it.

torch's profiler lists every aten op a call runs, nested ones too: on CPU an ``add_`` of int32 words into the
int64 counters runs ``aten::to`` (a converted copy: an allocation), and an ``index_add_`` with a strided index
runs ``aten::contiguous`` (another) before they add; either would show here.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.counting import CounterWords, LayerCounting
from capwatch.sizing.backends import DEEPEP
from torch.profiler import ProfilerActivity, profile

from tests.support.host_reads import forbid_host_reads
from tests.support.workspace import workspace_counter_words

CAP, EP_SIZE = 16, 2


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("leader", [True, False], ids=["step leader", "other layer"])
def test_a_counted_dispatch_copies_and_adds_once_and_allocates_nothing(leader, captured):
    counters = DispatchCounters(CAP, EP_SIZE)
    if captured:
        counters._eager = lambda: False
    # This rank's row of a FlashInfer workspace; its send and receive counter words as the backend views them.
    words = workspace_counter_words(torch.zeros(EP_SIZE, 256, dtype=torch.uint8)[0], EP_SIZE)
    layer = LayerCounting(counters, 0, EP_SIZE, CounterWords(words), step_leader=leader)
    words.copy_(torch.tensor([[3, 2], [1, 4]], dtype=torch.int32))  # what FlashInfer's kernel writes
    received = [torch.zeros(EP_SIZE, 8, 4)]

    def transport(token_selected_experts, input_payloads, runtime_max_tokens_per_rank, invalid_token_expert_id,
                  expert_id_payload_index):  # FlashInfer's launch: no torch op on the host here
        return received

    counted = layer.counted(transport)  # as the FlashInfer hook shadows MoeAlltoAll.dispatch
    # What it counts into, by name (benchmarks/sglang_dispatch.py rebuilds it around a no-op transport).
    assert counted.counting is layer and counted.transport is transport and layer.traffic.words is words
    experts = torch.zeros(5, 8, dtype=torch.int32)
    counted(experts, [], 8, invalid_token_expert_id=-1, expert_id_payload_index=1)  # the step's view is kept now
    with forbid_host_reads(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        assert counted(experts, [], 8, invalid_token_expert_id=-1, expert_id_payload_index=1) is received
    ops = sorted(event.name for event in profiler.events())
    assert ops == sorted(["aten::copy_", "aten::add_"] + (["aten::add_"] if leader and captured else [])), ops
    assert [event.name for event in profiler.events() if event.cpu_memory_usage != 0] == [], "allocated per call"
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == 2
    assert snapshot.tokens_sent_per_rank == (6, 4) and snapshot.tokens_received_per_rank == (2, 8)
    assert snapshot.forward_steps == (2 if leader else 0)
    if leader:
        assert snapshot.runtime_tokens_histogram[8] == 2 and snapshot.local_tokens_histogram[5] == 2


@pytest.mark.parametrize("leader", [True, False], ids=["step leader", "other layer"])
def test_a_counted_deepep_dispatch_allocates_nothing_and_reads_nothing_back(leader):
    """The DeepEP hook's ``dispatch_a`` + ``dispatch_b`` per call: the pairs' destinations and weights into the
    scratch made at adoption, the layout range's high words summed into the record, one ``add_``; nothing
    allocated (a Python int divisor was wrapped into a new tensor on every call), nothing read back."""
    from capwatch.sglang_plugin.hooks.deepep import Traffic, counted_dispatch_a, counted_dispatch_b

    experts, top_k = 8, 2
    counters = DispatchCounters(CAP, EP_SIZE)
    layer = LayerCounting(counters, 0, EP_SIZE, counters.traffic_record(), rules=DEEPEP, step_leader=leader)
    # Each of the 4 local experts' layout range: pairs from each rank in the high words (rank 0 sent 1 + 2 + 0 + 0,
    # rank 1 3 + 4 + 0 + 1), as DeepEP lays it out: [local experts, ranks].
    layout = torch.tensor([[1, 3], [2, 4], [0, 0], [0, 1]], dtype=torch.int64) << 32
    dispatcher = SimpleNamespace(num_experts=experts, num_max_dispatch_tokens_per_rank=CAP, router_topk=top_k,
                                 handle=(None, layout))
    traffic = Traffic.made(dispatcher, layer)
    topk_ids = torch.tensor([[0, 5], [7, -1], [3, 4]], dtype=torch.int64)  # ranks 0, 1 | 1, none | 0, 1

    def dispatch_a(hidden_states, topk_output):  # DeepEP's launch: what SGLang keeps for dispatch_b
        return hidden_states, topk_ids

    def dispatch_b(*state):
        return state[0]

    counted_a = counted_dispatch_a(dispatch_a, dispatcher, layer, traffic)
    counted_b = counted_dispatch_b(dispatch_b, dispatcher, layer, traffic)
    hidden = torch.zeros(3, 4)
    counted_b(*counted_a(hidden, None))
    with forbid_host_reads(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        assert counted_b(*counted_a(hidden, None)) is hidden
    assert [event.name for event in profiler.events() if event.cpu_memory_usage != 0] == [], "allocated per call"
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == 2
    assert snapshot.tokens_sent_per_rank == (4, 6) and snapshot.tokens_received_per_rank == (6, 16)
    assert snapshot.forward_steps == (2 if leader else 0)
