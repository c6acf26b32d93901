"""DispatchCounters: exact accounting, one host copy per snapshot, no host reads on record."""

from __future__ import annotations

import threading

import pytest
import torch
from capwatch.dispatcher.counters import CounterSnapshot, DispatchCounters, pause_snapshots

from tests.support.host_reads import HostReadError, forbid_host_reads
from tests.support.workspace import workspace_counter_words


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


def test_recording_reads_nothing_back_to_the_host():
    counters = DispatchCounters(cap=16, ep_size=2)
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


def test_one_step_is_one_kernel_whatever_its_r_and_local_batch():
    """The step's R bin and local-batch bin land with one add_ (a strided two-element view of the state): checked
    against a plain count for every (R, local) pair of a small cap, over-cap bins included."""
    cap = 5
    counters = DispatchCounters(cap=cap, ep_size=2)
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
    assert snapshot.dispatch_calls == 0  # a step is no dispatch call: record_traffic/record_dispatch count them
    assert snapshot.runtime_tokens_sum == sum(runtime for runtime, _ in pairs) + 4
    assert (snapshot.max_runtime_tokens, snapshot.max_local_tokens) == (cap + 2, cap + 2)


def test_traffic_is_one_add_of_a_record_and_counts_its_call():
    counters = DispatchCounters(cap=8, ep_size=3)
    words = workspace_counter_words(torch.zeros(256, dtype=torch.uint8), ep_size=3)
    words[0] = torch.tensor([1, 0, 2], dtype=torch.int32)
    words[1] = torch.tensor([3, 1, 0], dtype=torch.int32)
    record = counters.traffic_record()
    for _ in range(2):
        record.counts.copy_(words)
        counters.record_traffic(record)
    snapshot = counters.snapshot()
    assert snapshot.tokens_sent_per_rank == (2, 0, 4) and snapshot.tokens_received_per_rank == (6, 2, 0)
    assert snapshot.dispatch_calls == 2 and snapshot.forward_steps == 0
    counters.record_dispatch(torch.tensor([1, 1, 1]), torch.tensor([0, 0, 5]))
    snapshot = counters.snapshot()
    assert snapshot.dispatch_calls == 3 and snapshot.tokens_received_per_rank == (6, 2, 5)


def test_recording_a_step_or_its_traffic_never_reads_the_device():
    counters = DispatchCounters(cap=16, ep_size=2)
    record = counters.traffic_record()
    record.counts.fill_(1)
    with forbid_host_reads():
        for runtime, local in ((3, 1), (16, 16), (40, 2), (0, 0)):
            counters.record_step(runtime, local)
            counters.record_traffic(record)
