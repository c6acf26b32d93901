"""DispatchCounters: exact accounting, one host copy per snapshot, no host reads on record.

Eager calls count steps and calls on the host; under CUDA graph capture they are device ops. On CPU the
device path is driven by swapping ``DispatchCounters._eager`` ("captured"), as a capture on CUDA takes it.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from capwatch.dispatcher.counters import CounterSnapshot, DispatchCounters, pause_snapshots
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from tests.support.host_reads import HostReadError, forbid_host_reads
from tests.support.workspace import workspace_counter_words


def captured(counters: DispatchCounters) -> DispatchCounters:
    """The counters as a CUDA graph capture drives them: every count a device op."""
    counters._eager = lambda: False
    return counters


def test_steps_fill_an_exact_histogram_and_the_max():
    counters = DispatchCounters(cap=4, ep_size=2)
    for runtime_tokens in (1, 3, 3, 4, 9, 5):
        counters.record_step(runtime_tokens)
    snapshot = counters.snapshot()
    assert snapshot.forward_steps == 6
    assert snapshot.runtime_tokens_histogram == (0, 1, 0, 2, 1, 2)  # bins 0..cap, then "> cap"
    assert snapshot.max_runtime_tokens == 9


def test_runtime_tokens_sum_is_exact_above_the_cap_too():
    counters = DispatchCounters(cap=4, ep_size=2)
    for runtime_tokens in (1, 3, 4, 9, 5, 0, 9):
        counters.record_step(runtime_tokens)
    snapshot = counters.snapshot()
    # The histogram's last bin only says "> cap"; the sum still adds 9, 5 and 9 exactly.
    assert snapshot.runtime_tokens_sum == 31
    assert snapshot.forward_steps == 7 and snapshot.runtime_tokens_histogram == (1, 1, 0, 1, 1, 3)


def test_each_step_records_this_ranks_own_local_batch_apart_from_r():
    counters = DispatchCounters(cap=4, ep_size=2)
    for runtime_tokens, local_tokens in ((3, 1), (4, 4), (4, 2), (9, 6), (3, 0)):
        counters.record_step(runtime_tokens, local_tokens)
    counters.record_step(2)  # a caller that does not pass its local batch
    snapshot = counters.snapshot()
    assert snapshot.local_tokens_histogram == (1, 1, 1, 0, 1, 1)  # bins 0..cap, then "> cap"
    assert snapshot.max_local_tokens == 6  # exact above the cap too
    assert snapshot.runtime_tokens_histogram == (0, 0, 1, 2, 2, 1) and snapshot.max_runtime_tokens == 9


def test_a_snapshot_built_without_the_sum_still_constructs():
    fields = dict(cap=4, ep_size=1, role="target", taken_at=0.0, dispatch_calls=0, forward_steps=0, tokens_sent=0,
                  tokens_received=0, max_runtime_tokens=0, chunked_rounds=0, overflow_events={},
                  runtime_tokens_histogram=(0,) * 6, tokens_sent_per_rank=(0,), tokens_received_per_rank=(0,))
    assert CounterSnapshot(**fields).runtime_tokens_sum == 0


def test_dispatches_add_per_rank_and_total_tokens():
    counters = DispatchCounters(cap=8, ep_size=3)
    counters.record_dispatch(torch.tensor([1, 0, 2]), torch.tensor([4, 4, 0]))
    counters.record_dispatch(torch.tensor([0, 5, 0], dtype=torch.int32), torch.tensor([1, 0, 0], dtype=torch.int32))
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == 2
    assert snapshot.tokens_sent_per_rank == (1, 5, 2) and snapshot.tokens_sent == 8
    assert snapshot.tokens_received_per_rank == (5, 4, 0) and snapshot.tokens_received == 9
    assert snapshot.forward_steps == 0


def test_overflows_by_kind_and_outcome():
    counters = DispatchCounters(cap=8, ep_size=1, role="draft")
    counters.record_overflow("runtime_over_cap", "chunked", chunked_rounds=3)
    counters.record_overflow("local_over_runtime", "raised")
    counters.record_overflow("local_over_runtime", "raised")
    snapshot = counters.snapshot()
    assert snapshot.role == "draft"
    assert snapshot.overflow_events[("runtime_over_cap", "chunked")] == 1
    assert snapshot.overflow_events[("local_over_runtime", "raised")] == 2
    assert snapshot.overflow_events_total == 3 and snapshot.chunked_rounds == 3
    with pytest.raises(ValueError, match="unknown overflow"):
        counters.record_overflow("imbalance", "raised")


@pytest.mark.parametrize("kwargs", [dict(cap=0, ep_size=2), dict(cap=8, ep_size=0), dict(cap=8, ep_size=2, role="x")])
def test_bad_construction_is_refused(kwargs):
    with pytest.raises(ValueError):
        DispatchCounters(**kwargs)


@pytest.mark.parametrize("mode", ["eager", "captured"])
def test_recording_reads_nothing_back_to_the_host(mode):
    counters = DispatchCounters(cap=16, ep_size=2)
    if mode == "captured":
        captured(counters)
    send, recv = torch.tensor([2, 1]), torch.tensor([0, 3])
    with forbid_host_reads():
        for runtime_tokens in (4, 16, 17, 40):
            counters.record_step(runtime_tokens, runtime_tokens // 2)
            counters.record_dispatch(send, recv)
        counters.record_overflow("runtime_over_cap", "raised")
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == 4 and snapshot.runtime_tokens_sum == 77
    assert snapshot.max_local_tokens == 20 and sum(snapshot.local_tokens_histogram) == 4


def test_forbid_host_reads_catches_reads_and_restores_them():
    value = torch.tensor([3])
    for read in (lambda: value.item(), lambda: value.tolist(), lambda: bool(value), lambda: int(value),
                 lambda: value.cpu()):
        with forbid_host_reads(), pytest.raises(HostReadError):
            read()
    assert value.item() == 3 and bool(value)


def test_paused_snapshots_return_the_one_taken_on_entry_and_resume_after():
    target, draft = DispatchCounters(cap=8, ep_size=1), DispatchCounters(cap=8, ep_size=1, role="draft")
    target.record_step(3)
    with pause_snapshots(target, draft):
        entry = target.snapshot()
        assert entry.forward_steps == 1 and draft.snapshot().forward_steps == 0
        target.record_step(5)  # recorded on the device, not copied while paused
        draft.record_step(2)
        with target.pause_snapshots():  # nests
            assert target.snapshot() is entry
        assert target.snapshot() is entry
    resumed = target.snapshot()
    assert resumed.forward_steps == 2 and resumed.runtime_tokens_sum == 8 and resumed.taken_at >= entry.taken_at
    assert draft.snapshot().forward_steps == 1


def test_pausing_waits_for_a_snapshot_in_flight():
    counters = DispatchCounters(cap=8, ep_size=1)
    copying, release, order = threading.Event(), threading.Event(), []
    original = counters._copy_to_host

    def slow_copy():
        copying.set()
        release.wait(5)
        order.append("copy done")
        return original()

    counters._copy_to_host = slow_copy
    reporter = threading.Thread(target=counters.snapshot)
    reporter.start()
    assert copying.wait(5)
    counters._copy_to_host = original

    def capture():
        with counters.pause_snapshots():
            order.append("paused")

    engine = threading.Thread(target=capture)
    engine.start()
    engine.join(0.2)
    assert engine.is_alive() and order == []  # still waiting for the copy
    release.set()
    reporter.join(5)
    engine.join(5)
    assert order == ["copy done", "paused"]


@pytest.mark.parametrize("mode", ["eager", "captured"])
def test_one_step_is_one_kernel_whatever_its_r_and_local_batch(mode):
    """Captured, the step's R bin and local-batch bin land with one add_ (a strided two-element view of the state);
    eagerly on the host: checked against a plain count for every (R, local) pair of a small cap, over-cap bins
    included."""
    cap = 5
    counters = DispatchCounters(cap=cap, ep_size=2)
    if mode == "captured":
        captured(counters)
    pairs = [(runtime, local) for runtime in range(cap + 3) for local in range(cap + 3)]
    for runtime, local in pairs:
        counters.record_step(runtime, local)
    counters.record_step(4)  # no local batch: only R
    snapshot = counters.snapshot()
    expected_r = [0] * (cap + 2)
    expected_local = [0] * (cap + 2)
    for runtime, local in pairs:
        expected_r[min(runtime, cap + 1)] += 1
        expected_local[min(local, cap + 1)] += 1
    expected_r[4] += 1
    assert list(snapshot.runtime_tokens_histogram) == expected_r
    assert list(snapshot.local_tokens_histogram) == expected_local
    assert snapshot.forward_steps == len(pairs) + 1
    # Eagerly a step is no dispatch call (each dispatch counts its own); a captured step stands for its layers' calls.
    assert snapshot.dispatch_calls == (0 if mode == "eager" else (len(pairs) + 1) * counters.layers_per_step)
    assert snapshot.runtime_tokens_sum == sum(runtime for runtime, _ in pairs) + 4
    assert (snapshot.max_runtime_tokens, snapshot.max_local_tokens) == (cap + 2, cap + 2)


@pytest.mark.parametrize("mode", ["eager", "captured"])
def test_traffic_is_one_add_of_a_record_and_its_call_is_counted_on_the_host_eagerly(mode):
    """Eagerly each dispatch is a call (a host int); captured, no dispatch op counts a call: the captured steps do
    (``layers_per_step`` each), so a dispatch captured without a step adds its tokens and no call."""
    counters = DispatchCounters(cap=8, ep_size=3)
    if mode == "captured":
        captured(counters)
    words = workspace_counter_words(torch.zeros(256, dtype=torch.uint8), ep_size=3)
    words[0] = torch.tensor([1, 0, 2], dtype=torch.int32)
    words[1] = torch.tensor([3, 1, 0], dtype=torch.int32)
    record = counters.traffic_record()
    record.counts.copy_(words)
    counters.record_traffic(record)
    counters.record_counter_words(record, words)
    snapshot = counters.snapshot()
    assert snapshot.tokens_sent_per_rank == (2, 0, 4) and snapshot.tokens_received_per_rank == (6, 2, 0)
    assert snapshot.dispatch_calls == (2 if mode == "eager" else 0) and snapshot.forward_steps == 0
    counters.record_dispatch(torch.tensor([1, 1, 1]), torch.tensor([0, 0, 5]))
    counters.record_call()  # a layer outside the traffic sample
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == (4 if mode == "eager" else 0) and snapshot.tokens_received_per_rank == (6, 2, 5)


def test_recording_a_step_or_its_traffic_never_reads_the_device():
    counters = DispatchCounters(cap=16, ep_size=2)
    record = counters.traffic_record()
    record.counts.fill_(1)
    with forbid_host_reads():
        for runtime, local in ((3, 1), (16, 16), (40, 2), (0, 0)):
            counters.record_step(runtime, local)
            counters.record_traffic(record)


def test_an_eager_step_launches_nothing_and_a_captured_one_launches_one_add():
    counters = DispatchCounters(cap=16, ep_size=2)
    counters.record_step(3, 2)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        counters.record_step(5, 4)
    assert [event.name for event in profiler.events()] == []
    captured(counters).record_step(5, 4)  # its two-element view is kept now
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        counters.record_step(5, 4)
    assert [event.name for event in profiler.events()] == ["aten::add_"]
    assert [event.name for event in profiler.events() if event.cpu_memory_usage != 0] == []
    snapshot = counters.snapshot()
    assert snapshot.forward_steps == 4 and snapshot.runtime_tokens_histogram[5] == 3
    assert snapshot.local_tokens_histogram[4] == 3 and snapshot.max_local_tokens == 4


def test_the_maxes_at_or_below_the_cap_are_the_highest_bins_of_host_and_device_together():
    counters = DispatchCounters(cap=8, ep_size=1)
    counters.record_step(3, 2)
    captured(counters).record_step(7, 6)
    counters._eager = lambda: True
    counters.record_step(5, 1)
    snapshot = counters.snapshot()
    assert (snapshot.max_runtime_tokens, snapshot.max_local_tokens) == (7, 6)
    counters.record_step(11, 9)  # above the cap: the histogram says only "> cap", the exact max is kept
    captured(counters).record_step(10, 12)
    snapshot = counters.snapshot()
    assert (snapshot.max_runtime_tokens, snapshot.max_local_tokens) == (11, 12)
    assert snapshot.runtime_tokens_sum == 3 + 7 + 5 + 11 + 10


CAP, EP_SIZE = 6, 3
tokens = st.integers(min_value=0, max_value=CAP + 4)
rank_counts = st.lists(st.integers(min_value=0, max_value=1000), min_size=EP_SIZE, max_size=EP_SIZE)
calls = st.one_of(
    st.tuples(st.just("step"), tokens, st.one_of(st.none(), tokens)),
    st.tuples(st.just("traffic"), rank_counts, rank_counts),
    st.tuples(st.just("words"), rank_counts, rank_counts),
    st.tuples(st.just("dispatch"), rank_counts, rank_counts),
    st.tuples(st.just("call"), st.none(), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), calls), max_size=40), st.integers(min_value=1, max_value=61))
def test_any_mix_of_eager_and_captured_calls_adds_up_exactly(mixed, layers_per_step):
    """Whatever is counted on the host and whatever on the device, the snapshot is the plain count of every step and
    every token; the calls are every eager call plus ``layers_per_step`` per captured step (a captured call is no
    op: a graph replays every layer's dispatch of its step)."""
    counters = DispatchCounters(cap=CAP, ep_size=EP_SIZE)
    counters.layers_per_step = layers_per_step
    counters._words_direct = True  # CUDA's eager path for the words (on CPU it allocates, but adds the same)
    record = counters.traffic_record()
    words = workspace_counter_words(torch.zeros(256, dtype=torch.uint8), ep_size=EP_SIZE)
    histogram, local_histogram = [0] * (CAP + 2), [0] * (CAP + 2)
    sent, received = [0] * EP_SIZE, [0] * EP_SIZE
    dispatches = runtime_sum = max_runtime = max_local = 0
    for is_captured, (kind, first, second) in mixed:
        counters._eager = (lambda: False) if is_captured else (lambda: True)
        if kind == "call":
            counters.record_call()
            dispatches += not is_captured
            continue
        if kind == "step":
            dispatches += layers_per_step if is_captured else 0
            counters.record_step(first, second)
            histogram[min(first, CAP + 1)] += 1
            runtime_sum, max_runtime = runtime_sum + first, max(max_runtime, first)
            if second is not None:
                local_histogram[min(second, CAP + 1)] += 1
                max_local = max(max_local, second)
            continue
        if kind == "traffic":
            record.counts.copy_(torch.tensor([first, second]))
            counters.record_traffic(record)
        elif kind == "words":
            words.copy_(torch.tensor([first, second], dtype=torch.int32))
            counters.record_counter_words(record, words)
        else:
            counters.record_dispatch(torch.tensor(first), torch.tensor(second))
        dispatches += not is_captured
        sent = [a + b for a, b in zip(sent, first)]
        received = [a + b for a, b in zip(received, second)]
    snapshot = counters.snapshot()
    assert list(snapshot.runtime_tokens_histogram) == histogram
    assert list(snapshot.local_tokens_histogram) == local_histogram
    assert snapshot.forward_steps == sum(histogram) and snapshot.runtime_tokens_sum == runtime_sum
    assert (snapshot.max_runtime_tokens, snapshot.max_local_tokens) == (max_runtime, max_local)
    assert snapshot.dispatch_calls == dispatches
    assert list(snapshot.tokens_sent_per_rank) == sent and list(snapshot.tokens_received_per_rank) == received


def test_a_snapshots_wait_for_its_copy_lets_the_gil_go():
    """The telemetry thread waits on its copy by asking the event and sleeping between (the GIL free), never inside
    ``Event.synchronize()`` (one C call: whether it lets the GIL go is torch's choice): the engine's thread runs
    meanwhile."""
    import threading

    from capwatch.dispatcher.counters import wait_without_the_gil

    class Copy:  # a CUDA event whose copy takes a while
        def __init__(self):
            self.asked = 0

        def query(self) -> bool:
            self.asked += 1
            return self.asked > 200

        def synchronize(self):
            raise AssertionError("a snapshot must not wait inside synchronize()")

    stop, engine_turns = threading.Event(), []

    def engine() -> None:
        while not stop.is_set():
            engine_turns.append(1)
            time.sleep(0)

    thread = threading.Thread(target=engine)
    thread.start()
    try:
        copy = Copy()
        before = len(engine_turns)
        wait_without_the_gil(copy, poll_s=1e-4)
        during = len(engine_turns) - before
    finally:
        stop.set()
        thread.join(5)
    assert copy.asked == 201 and during > 50, (copy.asked, during)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_a_librarys_layers_on_one_counters_count_every_call_eagerly_and_captured(captured):
    """Three InstrumentedDispatchers (a model's MoE layers) share one DispatchCounters, as a library user or the
    demo builds them (no SGLang session to elect): every layer's call is counted, captured too, where a captured
    call launches nothing and the snapshot multiplies the captured steps by the layers (it counted one a step)."""
    from capwatch.dispatcher.instrumented import InstrumentedDispatcher

    from tests.telemetry.test_interval_invariants import OneRankBackend

    counters = DispatchCounters(8, 1)
    if captured:
        counters._eager = lambda: False  # every count a device op, as under CUDA graph capture
    layers = [InstrumentedDispatcher(OneRankBackend(), counters, 8, step_leader=index == 0) for index in range(3)]
    experts = torch.zeros(4, 1, dtype=torch.int32)
    for _ in range(5):
        for layer in layers:
            layer.run(experts, [torch.ones(4, 2), experts], 4, lambda received: received[0])
    snapshot = counters.snapshot()
    assert (snapshot.forward_steps, snapshot.dispatch_calls) == (5, 15)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(1, 4), (2, 8), (4, 16), (8, 256)]),
       st.lists(st.lists(st.integers(-1, 255), min_size=1, max_size=8), min_size=1, max_size=20),
       st.lists(st.integers(0, 1 << 20), min_size=1, max_size=64))
def test_expert_bins_fold_into_exact_per_rank_traffic_and_pairs_without_an_expert_count_for_no_rank(
        geometry, calls, received_counts):
    """What DeepEP's hook adds into the expert bins (one ``put_`` of the routing, one ``add_`` of the count words
    per call) reads back per rank as a plain count of the same pairs; a -1 expert counts nowhere."""
    ep_size, experts = geometry
    counters = DispatchCounters(cap=8, ep_size=ep_size)
    bins = counters.expert_traffic(experts)
    assert counters.expert_traffic(experts) is bins  # made once
    with pytest.raises(ValueError, match="experts"):
        counters.expert_traffic(experts * 2)
    local = experts // ep_size
    words = torch.tensor([received_counts[i % len(received_counts)] for i in range(local * ep_size)],
                         dtype=torch.int64).view(local, ep_size)
    sent, received = [0] * ep_size, [0] * ep_size
    for ids in calls:
        topk_ids = torch.tensor([min(expert, experts - 1) for expert in ids], dtype=torch.int64)
        bins.sent.put_(topk_ids, torch.ones(topk_ids.numel(), dtype=torch.int64), accumulate=True)
        bins.received.add_(words)
        for expert in topk_ids.tolist():
            if expert >= 0:
                sent[expert // local] += 1
        for rank in range(ep_size):
            received[rank] += int(words[:, rank].sum())
    snapshot = counters.snapshot()
    assert list(snapshot.tokens_sent_per_rank) == sent and snapshot.tokens_sent == sum(sent)
    assert list(snapshot.tokens_received_per_rank) == received and snapshot.tokens_received == sum(received)
