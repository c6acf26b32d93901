"""The FlashInfer, DeepEP and local-batch hooks' counting (pplx, Mooncake EP, NIXL EP, DeepEP v2, MoRI), per call,
in the main venv: exactly the torch ops the chosen design promises (docs/dispatcher.md, "Counting a GPU does not
notice"), per kind of layer, eagerly and under a simulated CUDA graph capture; nothing allocated, nothing read back
to the host, and the counts land.

The design: the step leader counts the step (on the host eagerly, one ``add_`` captured); every layer's call is a
host int eagerly and no op captured; only the layers of the traffic sample add their per-rank counts, one ``add_``
of FlashInfer's int32 words on CUDA. So, per counted call, device ops:

=====================  =====  ========
layer                  eager  captured
=====================  =====  ========
step leader            1      2
sampled                1      1
any other              0      0
=====================  =====  ========

"captured" drives the counters' device path on CPU (``DispatchCounters._eager``), as a capture on CUDA takes it;
"CUDA's words" adds the words as CUDA does (``_words_direct``; on CPU that add converts into a temporary, so the
ops are counted as the top-level ops the call dispatches). On CPU itself the words are a ``copy_`` into the layer's
int64 record and one ``add_``: listed too, and checked to allocate nothing. A change that adds a device op per
layer fails here without a GPU.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.counting import TRAFFIC_SAMPLE_STRIDE, CounterWords, LayerCounting, elect
from capwatch.backends.deepep import RULES as DEEPEP
from torch.profiler import ProfilerActivity, profile

from tests.support.host_reads import forbid_host_reads
from tests.support.workspace import workspace_counter_words

CAP, EP_SIZE = 16, 2
LAYERS = 58  # DeepSeek-V3's MoE layers
KINDS = {"step leader": 0, "sampled": TRAFFIC_SAMPLE_STRIDE, "other layer": 1}
# Device ops per counted call, (eager, captured), as the design says: the table in the module docstring.
DEVICE_OPS = {"step leader": (1, 2), "sampled": (1, 1), "other layer": (0, 0)}


VIEWS = {"aten::flatten", "aten::slice", "aten::select", "aten::view", "aten::as_strided", "aten::alias"}


def top_level_ops(profiler) -> list[str]:
    """The ops the call itself dispatched (not those an op runs inside it), views apart: a view launches nothing."""
    return sorted(event.name for event in profiler.events() if event.cpu_parent is None and event.name not in VIEWS)


def flashinfer_layers(counters: DispatchCounters):
    """A role of ``LAYERS`` layers elected as the FlashInfer hook's session elects them, each with its own workspace
    counter words (as the backend views them)."""
    words = [workspace_counter_words(torch.zeros(EP_SIZE, 256, dtype=torch.uint8)[0], EP_SIZE) for _ in range(LAYERS)]
    layers = [LayerCounting(counters, 0, EP_SIZE, CounterWords(each)) for each in words]
    elect(counters, layers, list(range(LAYERS)), TRAFFIC_SAMPLE_STRIDE)
    for each in words:
        each.copy_(torch.tensor([[3, 2], [1, 4]], dtype=torch.int32))  # what FlashInfer's kernel writes
    return layers, words


@pytest.mark.parametrize("cuda_words", [True, False], ids=["CUDA's words", "CPU's words"])
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_counted_flashinfer_dispatch_runs_the_designs_ops_and_allocates_nothing(kind, captured, cuda_words):
    counters = DispatchCounters(CAP, EP_SIZE)
    counters._words_direct = cuda_words
    if captured:
        counters._eager = lambda: False
    layers, _ = flashinfer_layers(counters)
    layer = layers[KINDS[kind]]
    received = [torch.zeros(EP_SIZE, 8, 4)]

    def transport(token_selected_experts, input_payloads, runtime_max_tokens_per_rank, invalid_token_expert_id,
                  expert_id_payload_index):  # FlashInfer's launch: no torch op on the host here
        return received

    counted = layer.counted(transport)  # as the FlashInfer hook shadows MoeAlltoAll.dispatch
    # What it counts into, by name (benchmarks/sglang_dispatch.py rebuilds it around a no-op transport).
    assert counted.counting is layer and counted.transport is transport
    experts = torch.zeros(5, 8, dtype=torch.int32)
    counted(experts, [], 8, invalid_token_expert_id=-1, expert_id_payload_index=1)  # the step's view is kept now
    with forbid_host_reads(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        assert counted(experts, [], 8, invalid_token_expert_id=-1, expert_id_payload_index=1) is received
    ops = top_level_ops(profiler)
    eager_ops, captured_ops = DEVICE_OPS[kind]
    if cuda_words:
        assert len(ops) == (captured_ops if captured else eager_ops), ops
        assert set(ops) <= {"aten::add_"}, ops
    else:  # on CPU the words go through the layer's int64 record: a copy_ before their add_
        traffic = ["aten::copy_", "aten::add_"] if layer.counts_traffic else []
        assert ops == sorted(traffic + (["aten::add_"] if kind == "step leader" and captured else [])), ops
        assert [event.name for event in profiler.events() if event.cpu_memory_usage != 0] == [], "allocated per call"
    snapshot = counters.snapshot()
    leads, sampled = kind == "step leader", kind != "other layer"
    assert snapshot.forward_steps == (2 if leads else 0)
    # Eagerly each call is a host int; captured, the calls are the captured steps' layers (a leader's two steps).
    assert snapshot.dispatch_calls == (2 if not captured else 2 * LAYERS if leads else 0)
    assert snapshot.tokens_sent_per_rank == ((6, 4) if sampled else (0, 0))
    assert snapshot.tokens_received_per_rank == ((2, 8) if sampled else (0, 0))
    if leads:
        assert snapshot.runtime_tokens_histogram[8] == 2 and snapshot.local_tokens_histogram[5] == 2


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_every_step_of_a_model_counts_r_the_local_batch_and_calls_exactly_and_the_sampled_traffic(captured):
    """58 layers, a few steps of varying R and local batch through every layer: the steps, the R and local-batch
    histograms and the calls are exact; the tokens are the sampled layers' (4 of 58), each exactly."""
    counters = DispatchCounters(CAP, EP_SIZE)
    if captured:
        counters._eager = lambda: False
    layers, _ = flashinfer_layers(counters)
    counted = [layer.counted(lambda *args: None) for layer in layers]
    steps = [(8, 5), (16, 16), (3, 1), (12, 7)]
    for runtime, local in steps:
        experts = torch.zeros(local, 8, dtype=torch.int32)
        for dispatch in counted:
            dispatch(experts, [], runtime)
    snapshot = counters.snapshot()
    sampled = [index for index, layer in enumerate(layers) if layer.counts_traffic]
    assert sampled == list(range(0, LAYERS, TRAFFIC_SAMPLE_STRIDE)) == [0, 16, 32, 48]
    assert [index for index, layer in enumerate(layers) if layer.step_leader] == [0]
    assert snapshot.forward_steps == len(steps) and snapshot.dispatch_calls == len(steps) * LAYERS
    assert snapshot.runtime_tokens_sum == sum(runtime for runtime, _ in steps)
    for runtime, local in steps:
        assert snapshot.runtime_tokens_histogram[runtime] == 1 and snapshot.local_tokens_histogram[local] == 1
    assert snapshot.tokens_sent_per_rank == (3 * len(steps) * len(sampled), 2 * len(steps) * len(sampled))


def test_an_overflow_is_counted_once_per_step_whichever_layers_guard():
    """Every layer guards (host ints, no device op); the raised overflow is counted by the layer that raises and
    the step by the leader: exact, sampled or not."""
    from capwatch.dispatcher.counting import CapOverflowError

    counters = DispatchCounters(CAP, EP_SIZE)
    layers, _ = flashinfer_layers(counters)
    experts = torch.zeros(4, 8, dtype=torch.int32)
    with pytest.raises(CapOverflowError):
        layers[0].counted(lambda *args: None)(experts, [], CAP + 1)  # the leader raises: the step ends there
    snapshot = counters.snapshot()
    assert snapshot.overflow_events == {**snapshot.overflow_events, ("runtime_over_cap", "raised"): 1}
    assert snapshot.overflow_events_total == 1 and snapshot.runtime_tokens_histogram[CAP + 1] == 1


# DeepEP's layers, per dispatch (dispatch_a + dispatch_b), the halves split (elect's split_halves): the step
# leader's layer one put_ of its topk_ids into the role's expert bins in dispatch_a (what it sends); the next place
# one add_ of its layout range's count words in dispatch_b (what it receives: an int32 view; on CUDA the kernel
# casts as it reads, on CPU a copy_ into scratch first); any other layer none. Captured, the leader's step adds its
# one add_: 3 nodes a step in all.
DEEPEP_PLACES = {"step leader": 0, "next place": 1, "other layer": 2}
DEEPEP_OPS = {("step leader", "CUDA's words"): ["aten::put_"], ("step leader", "CPU's words"): ["aten::put_"],
              ("next place", "CUDA's words"): ["aten::add_"], ("next place", "CPU's words"): ["aten::add_", "aten::copy_"],
              ("other layer", "CUDA's words"): [], ("other layer", "CPU's words"): []}
DEEPEP_EXPERTS, DEEPEP_TOP_K = 8, 2
# Each of the 4 local experts' layout range: pairs from each rank in the high words (rank 0 sent 1 + 2 + 0 + 0,
# rank 1 3 + 4 + 0 + 1), the begin offsets in the low ones, as DeepEP lays it out: [local experts, ranks].
DEEPEP_LAYOUT = (torch.tensor([[1, 3], [2, 4], [0, 0], [0, 1]], dtype=torch.int64) << 32) | \
    torch.tensor([[0, 1], [0, 2], [0, 0], [0, 0]], dtype=torch.int64)
DEEPEP_TOPK_IDS = torch.tensor([[0, 5], [7, -1], [3, 4]], dtype=torch.int64)  # ranks 0, 1 | 1, none | 0, 1


def deepep_role(places: int, captured: bool, cuda_words: bool):
    """A role of ``places`` DeepEP layers elected as the DeepEP hook's session elects them (the leader's layer
    alone sampled, the halves split), each layer's ``dispatch_a`` and ``dispatch_b`` counted by the hook around a
    DeepEP-shaped stand-in; (counters, layers, [(counted dispatch_a, counted dispatch_b)])."""
    import dataclasses

    from capwatch.sglang_plugin.hooks.deepep import Traffic, counted_dispatch_a, counted_dispatch_b

    counters = DispatchCounters(CAP, EP_SIZE)
    if captured:
        counters._eager = lambda: False
    layers = [LayerCounting(counters, 0, EP_SIZE, counters.expert_traffic(DEEPEP_EXPERTS), rules=DEEPEP)
              for _ in range(places)]
    elect(counters, layers, list(range(places)), traffic_stride=None, split_halves=True)  # as the session does
    dispatcher = SimpleNamespace(num_experts=DEEPEP_EXPERTS, num_max_dispatch_tokens_per_rank=CAP,
                                 router_topk=DEEPEP_TOP_K, handle=(None, DEEPEP_LAYOUT))

    def dispatch_a(hidden_states, topk_output):  # DeepEP's launch: what SGLang keeps for dispatch_b
        return hidden_states, DEEPEP_TOPK_IDS

    def dispatch_b(*state):
        return state[0]

    calls = []
    for layer in layers:
        traffic = Traffic.made(dispatcher, layer)
        if cuda_words:  # the CUDA path: the count words added as they are (on CPU that add_ converts into a temporary)
            traffic = dataclasses.replace(traffic, received_words=None)
        calls.append((counted_dispatch_a(dispatch_a, dispatcher, layer, traffic),
                      counted_dispatch_b(dispatch_b, dispatcher, layer, traffic)))
    return counters, layers, calls


@pytest.mark.parametrize("cuda_words", [True, False], ids=["CUDA's words", "CPU's words"])
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("kind", list(DEEPEP_PLACES))
def test_a_counted_deepep_dispatch_launches_at_most_one_op_the_received_half_on_the_next_place(kind, captured,
                                                                                               cuda_words):
    """The DeepEP hook's ``dispatch_a`` + ``dispatch_b`` per dispatch: the step leader's layer one ``put_`` (what it
    sends), the next place one ``add_`` (what it receives; it was both on the leader's layer, two ops a dispatch,
    eight before that); any other layer none. At most one device op per dispatch eagerly, the leader's step add_
    beside its put_ captured. Nothing allocated (on CPU's path), nothing read back, and the counts exact per rank
    after the snapshot folds the expert bins."""
    place = DEEPEP_PLACES[kind]
    counters, layers, calls = deepep_role(3, captured, cuda_words)
    layer, (counted_a, counted_b) = layers[place], calls[place]
    assert (layer.step_leader, layer.counts_traffic, layer.counts_received) == (place == 0, place == 0, place == 1)
    hidden = torch.zeros(3, 4)
    counted_b(*counted_a(hidden, None))
    with forbid_host_reads(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        assert counted_b(*counted_a(hidden, None)) is hidden
    if not cuda_words:
        assert [event.name for event in profiler.events() if event.cpu_memory_usage != 0] == [], "allocated per call"
    step = ["aten::add_"] if place == 0 and captured else []
    assert top_level_ops(profiler) == sorted(DEEPEP_OPS[kind, "CUDA's words" if cuda_words else "CPU's words"] + step)
    # The goal: at most one device op per dispatch eagerly (a copy_ into scratch is CPU's path only).
    assert len([op for op in top_level_ops(profiler) if op != "aten::copy_"]) == \
        (1 if place < 2 else 0) + (place == 0 and captured)
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == (2 if not captured else 2 * 3 if place == 0 else 0)
    assert snapshot.tokens_sent_per_rank == ((4, 6) if place == 0 else (0, 0))
    assert snapshot.tokens_received_per_rank == ((6, 16) if place == 1 else (0, 0))
    assert snapshot.tokens_sent == (10 if place == 0 else 0) and snapshot.tokens_received == (22 if place == 1 else 0)
    assert snapshot.forward_steps == (2 if place == 0 else 0)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("places", [3, 1], ids=["three places", "one place"])
def test_a_deepep_step_launches_one_op_per_dispatch_at_most_and_three_nodes_captured(places, captured):
    """A whole DeepEP step through every layer of the role (CUDA's words): each dispatch at most one op eagerly,
    the step 3 nodes captured (the step, the put_, the add_), sent and received each counted once a step. A role
    of a single MoE place keeps both halves on its one layer: two ops on that dispatch, the only exception."""
    counters, layers, calls = deepep_role(places, captured, cuda_words=True)
    hidden = torch.zeros(3, 4)
    per_dispatch = []
    for counted_a, counted_b in calls:
        with forbid_host_reads(), profile(activities=[ProfilerActivity.CPU]) as profiler:
            counted_b(*counted_a(hidden, None))
        per_dispatch.append(top_level_ops(profiler))
    if places == 1:
        assert (layers[0].counts_traffic, layers[0].counts_received) == (True, True)
        assert per_dispatch == [sorted(["aten::put_", "aten::add_"] + (["aten::add_"] if captured else []))]
    else:
        eager = [["aten::put_"], ["aten::add_"], []]
        assert per_dispatch == [sorted(ops + (["aten::add_"] if captured and place == 0 else []))
                                for place, ops in enumerate(eager)]
    assert sum(map(len, per_dispatch)) == 2 + captured  # 3 nodes a captured step, in all
    snapshot = counters.snapshot()
    assert snapshot.forward_steps == 1 and snapshot.dispatch_calls == places
    assert (snapshot.tokens_sent_per_rank, snapshot.tokens_received_per_rank) == ((2, 3), (3, 8))  # one dispatch each


def test_the_session_elects_places_in_model_order_with_micro_batch_twins_sharing_one():
    """Layer ids arrive in any order (some unknown: last, each its own place); with DeepEP's two-batch overlap a
    layer id's two dispatchers share a place, so both lead on the lowest and the calls per step are the places."""
    from capwatch.agent.session import RoleWatch

    for lead_per_micro_batch, stride in ((False, 2), (True, None)):
        counters = DispatchCounters(CAP, EP_SIZE)
        watch = RoleWatch("target", counters, {}, lead_per_micro_batch=lead_per_micro_batch, traffic_stride=stride)
        ids = [7, 3, 3, None, 5, 7, None]
        layers = [LayerCounting(counters, 0, EP_SIZE, counters.traffic_record()) for _ in ids]
        for layer_id, layer in zip(ids, layers):
            watch.add_layer(layer_id, layer, object())
        leaders = [layer_id for layer_id, layer in zip(ids, layers) if layer.step_leader]
        sampled = [layer_id for layer_id, layer in zip(ids, layers) if layer.counts_traffic]
        if lead_per_micro_batch:  # places: 3 3 | 5 | 7 7 | None | None
            assert leaders == [3, 3] and sampled == [3, 3] and counters.layers_per_step == 5
        else:  # places: 3 | 3 | 5 | 7 | 7 | None | None; every 2nd from the first
            assert leaders == [3] and counters.layers_per_step == 7
            assert sorted(sampled, key=lambda i: math.inf if i is None else i) == [3, 5, 7, None]


# A local-batch backend's leader layer (DeepEP v2, Mooncake EP, NIXL EP, pplx, MoRI), per counted call: one put_ of
# its topk_ids into the role's expert bins, after a copy_ into int64 scratch where they are SGLang's int32. Any
# other layer: none.
LOCAL_BATCH_OPS = {torch.int64: ["aten::put_"], torch.int32: ["aten::copy_", "aten::put_"]}


def local_batch_hook(hook: str):
    """A local-batch backend's rules and what meets its overflows, as its hook module counts it: Mooncake EP's
    (counted, then handed to the library's own check), or MoRI's (refused: MoRI checks nothing)."""
    from capwatch.sglang_plugin.hooks import adoption, mooncake, mori

    return {"mooncake": (mooncake.MOONCAKE, adoption.count_overflow), "mori": (mori.MORI, mori.refuse_overflow)}[hook]


def local_batch_layers(counters: DispatchCounters, rules, experts: int) -> list[LayerCounting]:
    """Three layers of a local-batch backend, elected as the session elects them: the traffic sample is the
    leader's layer alone."""
    layers = [LayerCounting(counters, 0, EP_SIZE, counters.expert_traffic(experts), rules=rules) for _ in range(3)]
    elect(counters, layers, [0, 1, 2], traffic_stride=None)
    return layers


@pytest.mark.parametrize("hook", ["mooncake", "mori"])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64], ids=["int32 ids", "int64 ids"])
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("leader", [True, False], ids=["step leader", "other layer"])
def test_a_counted_local_batch_dispatch_counts_the_sent_pairs_in_one_put(leader, captured, ids_dtype, hook):
    """``hooks/local_batch.py``'s counted dispatch: on the step leader's layer one ``put_`` (it was six ops: a clamp,
    a div_, a ge, a zero_, a scatter_add_ and the record's add_; MoRI's own was six too), a ``copy_`` before it only
    for int32 ids; any other layer none. Nothing allocated, nothing read back; the pairs sent per rank exact (a -1
    expert's for none)."""
    from capwatch.sglang_plugin.hooks.local_batch import SentPairs, counted_dispatch

    experts, top_k = 8, 2
    rules, overflow = local_batch_hook(hook)
    counters = DispatchCounters(CAP, EP_SIZE)
    if captured:
        counters._eager = lambda: False
    layers = local_batch_layers(counters, rules, experts)
    layer = layers[0 if leader else 1]
    assert layer.counts_traffic == leader
    sent = SentPairs.made(layer, CAP, top_k)
    topk_ids = torch.tensor([[0, 5], [7, -1], [3, 4]], dtype=ids_dtype)  # ranks 0, 1 | 1, none | 0, 1
    hidden = torch.zeros(3, 4)

    def dispatch(hidden_states, topk_output):  # the library's launch
        return hidden_states

    counted = counted_dispatch(dispatch, layer, sent, overflow)
    counted(hidden, SimpleNamespace(topk_ids=topk_ids))
    with forbid_host_reads(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        assert counted(hidden, SimpleNamespace(topk_ids=topk_ids)) is hidden
    assert [event.name for event in profiler.events() if event.cpu_memory_usage != 0] == [], "allocated per call"
    expected = (LOCAL_BATCH_OPS[ids_dtype] if leader else []) + (["aten::add_"] if leader and captured else [])
    assert top_level_ops(profiler) == sorted(expected)
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == (2 if not captured else 2 * 3 if leader else 0)
    assert snapshot.tokens_sent_per_rank == ((4, 6) if leader else (0, 0))
    assert snapshot.tokens_received_per_rank == (0, 0)
    assert snapshot.forward_steps == (2 if leader else 0)
    if leader:
        assert snapshot.local_tokens_histogram[3] == 2


@pytest.mark.parametrize("hook", ["mooncake", "mori"])
def test_a_local_batch_overflow_is_counted_then_handed_on_or_refused_before_the_library(hook):
    """A batch above the cap, counted once before the library sees anything; Mooncake EP's then reaches its own
    assertion (the library's check ends the rank), MoRI's never reaches MoRI, which would take it silently."""
    from capwatch.dispatcher.counting import CapOverflowError
    from capwatch.sglang_plugin.hooks.local_batch import SentPairs, counted_dispatch

    rules, overflow = local_batch_hook(hook)
    counters = DispatchCounters(CAP, EP_SIZE)
    layer = local_batch_layers(counters, rules, 8)[0]
    reached = []

    def dispatch(hidden_states, topk_output):
        reached.append(hidden_states.shape[0])
        raise AssertionError("the library's own check")

    counted = counted_dispatch(dispatch, layer, SentPairs.made(layer, CAP, 2), overflow)
    ids = torch.zeros(CAP + 1, 2, dtype=torch.int64)
    with pytest.raises(CapOverflowError if hook == "mori" else AssertionError):
        counted(torch.zeros(CAP + 1, 4), SimpleNamespace(topk_ids=ids))
    assert reached == ([] if hook == "mori" else [CAP + 1])
    counted_events = {kind: n for kind, n in counters.snapshot().overflow_events.items() if n}
    assert counted_events == {("runtime_over_cap", "raised"): 1}
