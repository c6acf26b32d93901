"""The reader on one log: the group's sample per window, configurations, overflows, and every line counted."""

from __future__ import annotations

import random

from capwatch.sglang_logs.advise import advise_from_sglang_logs
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sglang_logs.logs import (
    DP,
    T0,
    decode_lines,
    every_line_counted_once,
    expected_history,
    rank,
    read,
    read_description,
    traffic,
    write,
)
from tests.support import sglang_logs as sg

LOG = sg.FORMAT["sglang-0.5.19+"]


def test_group_peak_per_window_is_the_max_over_dp_ranks_times_tokens_per_request(tmp_path):
    rng = random.Random(3)
    table = {(m, s, d): rng.randint(0, 120) + (60 if d == 5 else 0)  # DP rank 5 is the hot one
             for m in range(30) for s in range(0, 60, 2) for d in range(DP)}
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(30, lambda m, s, d: table[m, s, d]))
    segment, = read([write(tmp_path / "server.log", lines)]).segments
    expected = [max(v for (m, _, _), v in table.items() if m == minute) for minute in range(30)]
    assert segment.history.sample_count == 30
    assert segment.history.max_peak_runtime_tokens == max(expected)
    assert sorted(segment.history.daily.values()) == [[max(expected), 30]]
    assert max(segment.dp_peak_tokens, key=segment.dp_peak_tokens.get) == 5


def test_speculative_decoding_dispatches_every_draft_token(tmp_path):
    lines = LOG.start(T0 - 30, speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_num_draft_tokens=4)
    lines += decode_lines(LOG, traffic(20, lambda m, s, d: 50 + d), accept_length=2.7)
    segment, = read([write(tmp_path / "spec.log", lines)]).segments
    assert segment.config.tokens_per_request == 4
    assert segment.history.max_peak_runtime_tokens == 57 * 4
    assert segment.config.limits.decode_cuda_graph_max_batch_size == 256


def test_overflow_assertions_are_overflow_windows_needing_their_R(tmp_path):
    lines = LOG.start(T0 - 30, chunked_prefill_size=2048) + decode_lines(LOG, traffic(10, lambda m, s, d: 100))
    crash_at = T0 + 10 * 60 + 5
    lines += LOG.record(crash_at, sg.overflow_traceback(6144, 4096), rank(5))
    lines += LOG.start(crash_at + 30, chunked_prefill_size=2048)  # the restart: the same args
    lines += decode_lines(LOG, traffic(10, lambda m, s, d: 100, start_s=T0 + 12 * 60))
    path = write(tmp_path / "crash.log", lines)
    segment, = read([path]).segments  # same args: one configuration, started twice
    assert segment.starts == 2 and segment.overflow_lines == 1 and segment.cap_seen == 4096
    assert segment.history.overflow_windows == 1 and segment.history.max_peak_runtime_tokens == 6144
    assert segment.dp_peak_tokens[5] == 6144
    advice = advise_from_sglang_logs([path]).advice
    assert advice.current_cap == 4096 and advice.action == "raise" and advice.recommended_cap > 6144
    assert "max_num_tokens of the log's overflow assertions" in read_description(advice.reasons)


def test_a_restart_with_new_args_starts_a_new_configuration(tmp_path):
    lines = LOG.start(T0 - 30, chunked_prefill_size=8192) + decode_lines(LOG, traffic(30, lambda m, s, d: 300))
    lines += LOG.start(T0 + 40 * 60, chunked_prefill_size=4096, decode_max_bs=128)
    lines += decode_lines(LOG, traffic(30, lambda m, s, d: 90, start_s=T0 + 41 * 60))
    path = write(tmp_path / "two.log", lines)
    first, second = read([path]).segments
    assert first.history.max_peak_runtime_tokens == 300 and second.history.max_peak_runtime_tokens == 90
    assert second.config.default_cap == 4096 and first.config.default_cap == 8192
    advice = advise_from_sglang_logs([path]).advice
    assert advice.max_peak_runtime_tokens == 90 and advice.current_cap == 4096
    assert "latest of 2 configurations" in read_description(advice.reasons)


def test_going_back_to_earlier_args_continues_that_configuration(tmp_path):
    """A, B, A: the latest configuration is A, with both of its periods."""
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(10, lambda m, s, d: 200))
    lines += LOG.start(T0 + 11 * 60, chunked_prefill_size=2048) + decode_lines(
        LOG, traffic(10, lambda m, s, d: 50, start_s=T0 + 12 * 60))
    lines += LOG.start(T0 + 23 * 60) + decode_lines(LOG, traffic(10, lambda m, s, d: 70, start_s=T0 + 24 * 60))
    first, second = read([write(tmp_path / "aba.log", lines)]).segments
    assert first.starts == 2 and first.history.sample_count == 20 and first.history.max_peak_runtime_tokens == 200
    assert second.starts == 1 and second.history.sample_count == 10


def test_rotated_and_gzipped_files_read_as_one_log_in_any_order(tmp_path):
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(60, lambda m, s, d: (m * 7 + d * 3) % 200 + 1))
    whole = read([write(tmp_path / "all.log", lines)])
    parts = [write(tmp_path / "server.log.2.gz", lines[:4000], gz=True),
             write(tmp_path / "server.log.1", lines[4000:9000]), write(tmp_path / "server.log", lines[9000:])]
    for order in (parts, parts[::-1], [parts[1], parts[2], parts[0]]):
        rotated = read(order)
        assert rotated.files == 3 and rotated.lines == whole.lines and rotated.decode_lines == whole.decode_lines
        assert rotated.segments[0].history.to_dict() == whole.segments[0].history.to_dict()
        assert rotated.duplicate_lines == 0


def test_unusable_lines_are_counted_never_fatal(tmp_path):
    lines = [sg.line(T0 - 120, sg.decode_message(5), rank(0))]  # a window before any args line: no configuration
    lines += LOG.start(T0 - 30) + ["garbage \x00 line", sg.line(T0, "Prefill batch, #new-seq: 1, #new-token: 10")]
    lines += decode_lines(LOG, traffic(20, lambda m, s, d: 64))
    lines += [sg.line(T0 + 5, "Decode batch, #running-req: oops, #token: 1")[:60],  # truncated, not a number
              "AssertionError: FlashInfer A2A runtime token geometry exceeds its fixed workspace: "
              "runtime_max_tokens_per_rank=x"]
    result = read([write(tmp_path / "dirty.log", lines)])
    assert result.unusable_lines == 2 and result.skipped_lines == 2 and result.unplaced_lines == 1
    assert result.unplaced[0].kind == "unconfigured"
    assert result.segments[0].history.max_peak_runtime_tokens == 64
    assert result.examples["unusable"][0].startswith(str(tmp_path / "dirty.log") + ":")


def test_the_args_line_without_stamp_applies_from_where_it_stands(tmp_path):
    lines = [f"server_args={sg.server_args()}"] + decode_lines(LOG, traffic(5, lambda m, s, d: 9))
    segment, = read([write(tmp_path / "bare.log", lines)]).segments
    assert segment.decode_lines == 5 * 30 * DP and segment.history.max_peak_runtime_tokens == 9


def test_windows_of_sub_minute_and_multi_minute_length(tmp_path):
    traffic_lines = traffic(12, lambda m, s, d: 10 + m * 3 + s // 10 + d)
    path = write(tmp_path / "w.log", LOG.start(T0 - 30) + decode_lines(LOG, traffic_lines))
    for window_s in (10.0, 30.0, 300.0):
        from capwatch.sglang_logs.reader import read_logs

        history = read_logs([path], window_s=window_s, cap=8192).segments[0].history
        assert history.to_dict() == expected_history(traffic_lines, 8192, window_s=window_s).to_dict()


@settings(max_examples=40, deadline=None)
@given(noise=st.lists(st.text(min_size=0, max_size=80), max_size=30), seed=st.integers(0, 1000))
def test_any_mix_of_lines_is_read_without_error_and_every_line_is_counted_once(tmp_path_factory, noise, seed):
    rng = random.Random(seed)
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(3, lambda m, s, d: rng.randint(1, 50)))
    for text in noise:
        lines.insert(rng.randrange(1, len(lines) + 1), text.replace("\n", " ").replace("\r", " "))
    path = write(tmp_path_factory.mktemp("mix") / "mix.log", lines)
    result = read([path])
    assert result.lines == len(lines)
    assert every_line_counted_once(result)
    assert result.decode_lines == 3 * 30 * DP


def test_a_log_that_begins_with_its_start_up_line_uses_it_from_the_first_window(tmp_path):
    """A server that starts and decodes within one minute: the start's window is its configuration's."""
    lines = LOG.start(T0 + 10) + decode_lines(LOG, traffic(3, lambda m, s, d: 7 + m, start_s=T0 + 20))
    result = read([write(tmp_path / "quick.log", lines)])
    assert result.unplaced_lines == 0 and result.segments[0].history.max_peak_runtime_tokens == 9
