"""Snapshots -> intervals: deltas, peaks above the cap, merging, torn snapshots."""

import dataclasses

import pytest
import torch
from pydantic import ValidationError

from capwatch.dispatcher.counters import DispatchCounters
from capwatch.telemetry.intervals import (
    IntervalTracker,
    coherent,
    cumulative_buckets,
    cumulative_counters,
    interval_between,
    merge_intervals,
)
from capwatch.telemetry.report import RankReport

from .reports import make_report

CAP = 16


def steps(counters: DispatchCounters, *runtime_tokens: int) -> None:
    for r in runtime_tokens:
        counters.record_step(r)
        counters.record_dispatch(torch.tensor([r, 0]), torch.tensor([0, r]))


def test_interval_holds_exactly_the_steps_between_two_snapshots():
    counters = DispatchCounters(CAP, 2)
    tracker = IntervalTracker(counters)
    steps(counters, 3, 3, 9)
    first, _ = tracker.close()
    steps(counters, 5, 16, 2)
    counters.record_overflow("local_over_runtime", "raised")
    second, snapshot = tracker.close()

    assert first.runtime_tokens_histogram == [(3, 2), (9, 1)]
    assert (first.forward_steps, first.dispatch_calls, first.peak_runtime_tokens) == (3, 3, 9)
    assert second.runtime_tokens_histogram == [(2, 1), (5, 1), (16, 1)]
    assert second.peak_runtime_tokens == 16
    assert [(e.kind, e.outcome, e.count) for e in second.overflow_events] == [("local_over_runtime", "raised", 1)]
    assert first.end_unix_s == second.start_unix_s
    assert tracker.last_interval == second
    assert snapshot.forward_steps == 6 and snapshot.max_runtime_tokens == 16


def test_each_interval_carries_this_ranks_own_largest_local_batch_not_r():
    counters = DispatchCounters(CAP, 2)
    tracker = IntervalTracker(counters)
    for runtime_tokens, local_tokens in ((9, 2), (12, 5), (12, 3)):  # R is the group's; 5 is this rank's
        counters.record_step(runtime_tokens, local_tokens)
    first, _ = tracker.close()
    counters.record_step(40, 30)  # above the cap and a new running max: exact
    second, _ = tracker.close()
    counters.record_step(40, 20)  # above the cap, below the running max: the honest floor cap + 1
    third, _ = tracker.close()
    idle, _ = tracker.close()
    counters.record_step(7)  # a caller that does not pass its local batch: unknown, not 0
    unknown, _ = tracker.close()
    assert (first.peak_runtime_tokens, first.max_local_tokens) == (12, 5)
    assert second.max_local_tokens == 30 and third.max_local_tokens == CAP + 1
    assert idle.max_local_tokens == 0 and unknown.max_local_tokens is None
    assert merge_intervals(first, second).max_local_tokens == 30
    assert merge_intervals(idle, unknown).max_local_tokens == 0  # a known value wins over an unknown one
    assert merge_intervals(unknown, unknown).max_local_tokens is None


def test_peak_above_the_cap_is_exact_when_the_interval_raised_the_max_else_cap_plus_one():
    counters = DispatchCounters(CAP, 2)
    tracker = IntervalTracker(counters)
    steps(counters, 4, 40)
    first, _ = tracker.close()
    steps(counters, 20)  # above the cap, below the running max 40: only "more than the cap" is known
    second, _ = tracker.close()
    assert first.runtime_tokens_histogram == [(4, 1), (CAP + 1, 1)]
    assert first.peak_runtime_tokens == 40
    assert second.peak_runtime_tokens == CAP + 1
    tracker.close()
    assert tracker.last_interval.forward_steps == 0 and tracker.last_interval.peak_runtime_tokens == 0


def test_merged_interval_adds_steps_and_keeps_the_peak():
    counters = DispatchCounters(CAP, 2)
    tracker = IntervalTracker(counters)
    steps(counters, 3, 7)
    counters.record_overflow("runtime_over_cap", "chunked", chunked_rounds=2)
    first, _ = tracker.close()
    steps(counters, 7, 12)
    counters.record_overflow("runtime_over_cap", "chunked", chunked_rounds=2)
    second, _ = tracker.close()
    merged = merge_intervals(first, second)
    assert merged.runtime_tokens_histogram == [(3, 1), (7, 2), (12, 1)]
    assert (merged.forward_steps, merged.dispatch_calls, merged.peak_runtime_tokens) == (4, 4, 12)
    assert [(e.kind, e.outcome, e.count) for e in merged.overflow_events] == [("runtime_over_cap", "chunked", 2)]
    assert (merged.start_unix_s, merged.end_unix_s) == (first.start_unix_s, second.end_unix_s)


def test_torn_snapshot_is_made_coherent_so_the_report_validates():
    # A step landing between the copy of the scalar counters and of the histogram.
    counters = DispatchCounters(CAP, 2)
    steps(counters, 5, 11)
    torn = dataclasses.replace(counters.snapshot(), forward_steps=1, max_runtime_tokens=5)
    fixed = coherent(torn)
    assert fixed.forward_steps == 2 and fixed.max_runtime_tokens == 11
    previous = coherent(dataclasses.replace(torn, runtime_tokens_histogram=(0,) * (CAP + 2)))
    report = make_report(counters=cumulative_counters(fixed), interval=interval_between(previous, fixed))
    assert RankReport.model_validate_json(report.model_dump_json()) == report
    with pytest.raises(ValidationError, match="forward_steps"):
        make_report(counters=cumulative_counters(torn), interval=interval_between(previous, fixed))


def test_prometheus_buckets_are_cumulative_and_the_sum_is_exact_for_over_cap_steps_too():
    counters = DispatchCounters(CAP, 2)
    steps(counters, 1, 4, 4, 16, 99)
    counts, total = cumulative_buckets(counters.snapshot(), (1.0, 4.0, 15.0, 16.0))
    assert counts == [1, 3, 3, 4]
    assert total == 1 + 4 + 4 + 16 + 99
    # Fixed bounds above the cap: the over-cap step (R = 99, the largest) counts from its bound on, never before.
    counts, _ = cumulative_buckets(counters.snapshot(), (24.0, 96.0, 99.0, 128.0))
    assert counts == [4, 4, 5, 5]
