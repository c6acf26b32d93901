"""Intervals never contradict themselves, whatever the steps, the cap, the overflow policy and the
moment a snapshot lands (between any two counting ops of a step, eager or on the device path).

Every interval is checked as the service checks it: built into a ``RankReport`` (its validators hold
R >= every local batch it reports, the cumulative max >= the interval's peak, the histogram = the steps),
and the intervals together must hold every step.
"""

from __future__ import annotations

import array
import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from capwatch.dispatcher.backend import A2ABackend
from capwatch.dispatcher.counters import DispatchCounters
from capwatch.dispatcher.instrumented import CapOverflowError, InstrumentedDispatcher
from capwatch.telemetry.intervals import IntervalTracker, cumulative_counters, interval_between, zero_snapshot
from capwatch.telemetry.report import RankReport

from .reports import make_report

HIDDEN = 2


class OneRankBackend(A2ABackend):
    """The all-to-all of a group of one rank: every token goes to this rank (the identity), padded to R."""

    ep_rank, ep_size, num_experts, top_k, device = 0, 1, 2, 1, torch.device("cpu")

    def __init__(self) -> None:
        super().__init__()
        self._counts = torch.zeros(1, dtype=torch.int64)

    @property
    def send_counts(self) -> torch.Tensor:
        return self._counts

    @property
    def recv_counts(self) -> torch.Tensor:
        return self._counts

    def _dispatch(self, token_selected_experts, payloads, runtime_max_tokens_per_rank, *_):
        self._counts.fill_(token_selected_experts.shape[0])
        padded = []
        for payload in payloads:
            out = payload.new_zeros((1, runtime_max_tokens_per_rank, *payload.shape[1:]))
            out[0, : payload.shape[0]] = payload
            padded.append(out)
        return padded

    def _combine(self, payload, runtime_max_tokens_per_rank):
        return payload[0]


class TappedHostState(array.array):
    """The counters' host array, calling ``tap`` after every write: where an eager step can be
    interrupted by a snapshot from another thread (the GIL may switch between any two writes)."""

    tap = None

    def __setitem__(self, index, value):
        super().__setitem__(index, value)
        if self.tap is not None:
            self.tap()


class TapDeviceOps(TorchFunctionMode):
    """Calls ``tap`` after every in-place tensor op: where a device step can be interrupted by a snapshot
    (its ops are separate kernels; the snapshot's copy runs on a side stream). Inside the handler the mode
    is off, so the snapshot's own ops are not tapped."""

    def __init__(self, tap):
        super().__init__()
        self._tap = tap

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "").endswith("_"):
            self._tap()
        return result


steps_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(0, 1000), st.booleans()), max_size=24)


def _step(cap: int, r_fraction: int, local_fraction: int, local_above_r: bool) -> tuple[int, int]:
    """An (R, local batch) pair around ``cap``: R in 0..4 cap; local <= R, or (rarely) above it."""
    runtime_tokens = max(1, r_fraction * cap // 250)  # R >= 1, as the backends require
    local_tokens = local_fraction * runtime_tokens // 1000
    if local_above_r:
        local_tokens = runtime_tokens + 1 + local_fraction % 3
    return runtime_tokens, local_tokens


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cap=st.integers(1, 40), policy=st.sampled_from(["raise", "chunk"]), device_path=st.booleans(),
       steps=steps_strategy, data=st.data())
def test_every_interval_validates_and_together_they_hold_every_step(cap, policy, device_path, steps, data):
    counters = DispatchCounters(cap, 1)
    if device_path:
        counters._eager = lambda: False  # every count a device op, as under CUDA graph capture
    clock = iter(range(1, 1_000_000)).__next__
    tracker = IntervalTracker(counters, clock=lambda: float(clock()))
    dispatcher = InstrumentedDispatcher(OneRankBackend(), counters, cap, overflow_policy=policy)
    intervals = []

    def cut() -> None:
        interval, snapshot = tracker.close()
        # The service's validation: raises where the interval contradicts itself or the totals.
        RankReport.model_validate(make_report(counters=cumulative_counters(snapshot), interval=interval, cap=cap,
                                              ep_size=1).model_dump())
        intervals.append(interval)

    def tap() -> None:
        if data.draw(st.booleans(), label="snapshot here"):
            cut()

    if not device_path:
        tapped = TappedHostState("q", counters._host_state)
        tapped.tap = tap
        counters._host_state = tapped
    pairs = []
    for r_fraction, local_fraction, local_above_r_roll, snapshot_after in steps:
        runtime_tokens, local_tokens = _step(cap, r_fraction, local_fraction, local_above_r_roll and r_fraction == 3)
        pairs.append((runtime_tokens, local_tokens))
        experts = torch.zeros(local_tokens, 1, dtype=torch.int32)
        payloads = [torch.ones(local_tokens, HIDDEN), experts]
        try:
            if device_path:
                with TapDeviceOps(tap):
                    dispatcher.run(experts, payloads, runtime_tokens, lambda received: received[0])
            else:
                dispatcher.run(experts, payloads, runtime_tokens, lambda received: received[0])
        except CapOverflowError:
            pass  # the raise policy, or a local batch above R: the step is counted, the rank survives
        if snapshot_after:
            cut()
    if not device_path:
        counters._host_state.tap = None
    cut()

    final = counters.snapshot()
    assert sum(interval.forward_steps for interval in intervals) == final.forward_steps == len(steps)
    assert sum(interval.dispatch_calls for interval in intervals) == final.dispatch_calls
    local_peaks = [interval.max_local_tokens or 0 for interval in intervals]
    assert max(local_peaks) == max((local for _, local in pairs), default=0)  # the largest batch, exact
    assert max(interval.peak_runtime_tokens for interval in intervals) == final.max_runtime_tokens or \
        final.max_runtime_tokens <= cap  # above the cap the max R is reported exactly in the interval that set it


def test_an_r_at_its_over_cap_floor_does_not_hide_a_larger_local_batch():
    """The demo's case (capwatch demo --cap 256 --overflow-policy chunk on a trace whose R runs near 860): the
    running max of R was set earlier, so this interval's R reads cap + 1; this rank's own batch of 544 is new."""
    cap = 256
    counters = DispatchCounters(cap, 1)
    counters.record_step(900, 300)
    previous = counters.snapshot()
    counters.record_step(860, 544)
    interval = interval_between(previous, counters.snapshot())
    assert interval.max_local_tokens == 544
    assert interval.peak_runtime_tokens == 544  # at least this rank's batch, not the floor 257


def test_the_cumulative_max_r_is_never_below_the_local_max_a_snapshot_saw():
    """A snapshot between a step's local max and its R max (the device path clamps them one after the other)."""
    from capwatch.telemetry.intervals import coherent

    cap = 8
    snapshot = zero_snapshot(cap, 1, "target", 0.0)
    torn = coherent(snapshot.__class__(**{**snapshot.__dict__, "forward_steps": 1,
                                         "runtime_tokens_histogram": (0,) * (cap + 1) + (1,),
                                         "local_tokens_histogram": (0,) * (cap + 1) + (1,),
                                         "max_local_tokens": 30, "max_runtime_tokens": 0}))
    assert torn.max_runtime_tokens == 30
    interval = interval_between(coherent(snapshot), torn)
    make_report(counters=cumulative_counters(torn), interval=interval, cap=cap, ep_size=1)


@pytest.fixture
def reporter_of():
    from capwatch.telemetry.report import RankIdentity
    from capwatch.telemetry.rank import rank_config
    from capwatch.telemetry.reporter import RankReporter, ReporterOptions, SendResult, Delivery

    made = []

    def make(counters, tracker):
        sent = []

        def sender(report):
            sent.append(report)
            return SendResult(Delivery.DELIVERED)

        reporter = RankReporter(
            counters, RankIdentity(cluster="unit", ep_rank=0, ep_size=counters.ep_size, boot_id="b"),
            rank_config(cap=counters.cap, ep_size=counters.ep_size, hidden_size=8, top_k=2, num_experts=4,
                        backend="torch"),
            ReporterOptions("http://127.0.0.1:9", interval_s=None), sender=sender, tracker=tracker)
        made.append(reporter)
        return reporter, sent

    yield make
    for reporter in made:
        reporter.close(timeout_s=0.5)


def test_an_error_cutting_an_interval_is_logged_once_counted_and_never_ends_the_rank(reporter_of, caplog):
    """No counting or reporting error ends a rank: cut_interval runs in the rank's own thread (a replay's)."""
    counters = DispatchCounters(8, 1)
    tracker = IntervalTracker(counters)
    reporter, sent = reporter_of(counters, tracker)
    reporter.start()
    real_close = tracker.close
    tracker.close = lambda: (_ for _ in ()).throw(ValueError("an interval that contradicts itself"))
    with caplog.at_level(logging.ERROR, logger="capwatch.telemetry.reporter"):
        for _ in range(3):
            counters.record_step(5, 5)
            reporter.cut_interval()  # raises nothing
    assert reporter.stats().errors == 3
    assert caplog.text.count("cutting an interval failed") == 1  # one line per streak
    assert "moe_a2a_reporter_errors_total" in caplog.text
    tracker.close = real_close
    counters.record_step(6, 6)
    reporter.cut_interval()
    assert reporter.close("done", timeout_s=5.0) is True
    assert sum(report.interval.forward_steps for report in sent) == 4  # the failed cuts' steps came with the next


def test_the_error_count_is_exported():
    from prometheus_client import CollectorRegistry, generate_latest

    from capwatch.telemetry.collector import DispatchCollector
    from capwatch.telemetry.rank import rank_config
    from capwatch.telemetry.report import RankIdentity
    from capwatch.telemetry.reporter import ReporterStats

    counters = DispatchCounters(8, 1)
    registry = CollectorRegistry()
    registry.register(DispatchCollector(
        IntervalTracker(counters), RankIdentity(cluster="unit", ep_rank=0, ep_size=1, boot_id="b"),
        rank_config(cap=8, ep_size=1, hidden_size=8, top_k=2, num_experts=4, backend="torch"),
        reporter_stats=lambda: ReporterStats(errors=2)))
    assert 'moe_a2a_reporter_errors_total{' in generate_latest(registry).decode()
    assert "} 2.0" in [line for line in generate_latest(registry).decode().splitlines()
                       if line.startswith("moe_a2a_reporter_errors_total{")][0]
