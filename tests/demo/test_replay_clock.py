"""The demo's replay clock (issue 21): the same trace gives the same advice on any machine, under any load.

The pure clock first (dates, report cuts, windows, whatever second a replay starts in), then the whole
demo as a user runs it: one untimed trace replayed three times, the second while this test keeps every
CPU busy, each printing the same advice object."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from capwatch.advisor.sample import window_start
from hypothesis import given, settings
from hypothesis import strategies as st

from capwatch.demo.ports import free_port_block
from capwatch.demo.replay_clock import REPORT_INTERVAL_S, STEP_INTERVAL_S, replay_clock, replay_origin
from capwatch.demo.session import DEMO_WINDOW_S
from capwatch.demo.trace import write_trace
from capwatch.demo.workload import Workload, WorkloadSpec, generate_token_counts
from tests.support import launcher
from tests.support.launcher import run_capwatch

T0 = 1_764_504_000.0  # a whole second


def windows_of(clock, steps: int, window_s: float) -> list[tuple[float, tuple[int, ...]]]:
    """(window, steps) of each report a rank sends, as the service files them: by the report's end date."""
    reports, current = [], []
    for step in range(steps):
        current.append(step)
        if clock.report_after(step) or step == steps - 1:
            reports.append((window_start(clock.date(step), window_s) - clock.origin_unix_s, tuple(current)))
            current = []
    return reports


def test_an_untimed_trace_runs_one_step_every_step_interval_and_says_so():
    clock = replay_clock(Workload([[1, 2]] * 5, source="trace.jsonl"), T0)
    assert [clock.offset_s(step) for step in range(5)] == pytest.approx([step * STEP_INTERVAL_S for step in range(5)])
    assert clock.date(4) == T0 + 0.1 and clock.duration_s == 0.1
    assert clock.source == 'one step every 25 ms (the trace has no "t")'
    assert "the generated workload" in replay_clock(Workload([[1]]), T0).source
    timed = replay_clock(Workload([[1], [2]], step_times_s=[2.0, 2.75], source="t.jsonl"), T0)
    assert (timed.date(0), timed.date(1), timed.source) == (T0 + 2.0, T0 + 2.75, 'the trace\'s own "t"')


def test_reports_are_cut_every_report_interval_of_replay_time_and_stay_inside_one_window():
    clock = replay_clock(Workload([[1]] * 100, source="trace.jsonl"), T0)  # 2.5 s of steps
    reports = windows_of(clock, 100, DEMO_WINDOW_S)
    per_report = round(REPORT_INTERVAL_S / STEP_INTERVAL_S)
    assert [steps for _, steps in reports] == [tuple(range(start, min(start + per_report, 100)))
                                              for start in range(0, 100, per_report)]
    assert [window for window, _ in reports] == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert not clock.report_after(99)  # the last step's report is the final one


@settings(max_examples=300, deadline=None)
@given(start=st.floats(1.6e9, 2.1e9), gaps_ms=st.lists(st.integers(0, 3_000), min_size=1, max_size=60),
       window_s=st.sampled_from([1.0, 2.0, 5.0, 60.0]))
def test_every_step_lands_in_the_same_window_whatever_second_the_replay_starts(start, gaps_ms, window_s):
    """Steps at any times (a trace's t, to the millisecond, pauses included): each report's window, counted
    from the origin, is the same for a replay started at any moment, and holds only steps of that window."""
    times, moment = [], 0.0
    for gap in gaps_ms:
        moment = round(moment + gap / 1000, 3)
        times.append(moment)
    workload = Workload([[1]] * len(times), step_times_s=times)
    reference = windows_of(replay_clock(workload, replay_origin(T0, window_s)), len(times), window_s)
    clock = replay_clock(workload, replay_origin(start, window_s))
    assert clock.origin_unix_s <= start < clock.origin_unix_s + window_s
    assert windows_of(clock, len(times), window_s) == reference
    for window, steps in reference:
        assert all(window <= times[step] < window + window_s for step in steps)


# --- the whole demo ------------------------------------------------------------------------------------

BUSY_S = 300  # the load ends itself by then, whatever happens to this test
BUSY = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def replay(trace, tmp_path, run: int) -> tuple[dict, str]:
    result = run_capwatch("demo", "--json", "--trace", str(trace), "--cap", "4096", "--overflow-policy", "chunk",
                          "--port", "0", "--metrics-port", str(free_port_block(2)),
                          "--state-dir", str(tmp_path / f"state-{run}"), timeout_s=360)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.timeout(1200)  # three whole demos, one slowed on purpose: each bounded by replay()'s own timeout
def test_three_replays_of_one_untimed_trace_one_under_load_give_the_same_advice(tmp_path):
    """The issue's case, smaller: 600 steps for 2 ranks, no "t", --cap 4096 --overflow-policy chunk --json.
    On the step clock they span 15 s: 15 windows of 1 s, whatever the machine's speed."""
    counts = generate_token_counts(WorkloadSpec(ranks=2, steps=600, peak_tokens_per_rank=160, day_steps=300,
                                                mean_decode_steps=20, seed=21))
    trace = tmp_path / "untimed.jsonl"
    with trace.open("w") as handle:
        write_trace(Workload(counts), handle)
    assert '"t"' not in trace.read_text()

    first, _ = replay(trace, tmp_path, 1)
    load = [launcher.start("-c", BUSY, str(BUSY_S), start_new_session=True)
            for _ in range(os.cpu_count() or 2)]
    try:
        started = time.monotonic()
        loaded, _ = replay(trace, tmp_path, 2)
        loaded_s = time.monotonic() - started
    finally:
        for process in load:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    third, _ = replay(trace, tmp_path, 3)

    assert first["sample_count"] == 15 and first["overflow_windows"] == 0  # the step clock's windows, not the wall's
    assert first["max_peak_runtime_tokens"] == max(max(step) for step in counts)
    assert first["action"] == "lower" and first["recommended_cap"] < 4096, first["reasons"]
    times = ("generated_unix_s",)
    same = [{key: value for key, value in advice.items() if key not in times} for advice in (first, loaded, third)]
    assert same[0] == same[1] == same[2], f"the loaded replay took {loaded_s:.0f} s"


def test_the_demo_says_which_clock_it_replays_on(tmp_path, service):
    trace = tmp_path / "untimed.jsonl"
    trace.write_text('{"tokens": [3, 4]}\n{"tokens": [5, 1]}\n')
    result = run_capwatch("demo", "--trace", str(trace), "--service-url", service, "--cluster", "clock-said",
                          "--metrics-port", str(free_port_block(2)))
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert 'replay clock: one step every 25 ms (the trace has no "t"), the last step at 0.025 s' in said
    assert "this machine's speed does not change the advice" in said
