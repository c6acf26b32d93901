"""Every log shape SGLang has written, wrapped or not: one log per format, written from its template
(tests/support/sglang_logs.py ``FORMATS``), read into exactly the history its lines give."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from capwatch.sglang_logs.reader import read_logs

from tests.sglang_logs.logs import DP, T0, decode_lines, expected_history, random_traffic, rank, read, traffic, write
from tests.support import sglang_logs as sg

DOCS = Path(__file__).parents[2] / "docs" / "sglang-logs.md"
NOISE = ["Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.05, #running-req: 60, "
         "#queue-req: 0", 'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK']


def format_log(log: sg.LogFormat, minutes: int = 30, seed: int = 1, start_s: float = T0, overflow: bool = True):
    """A start, decode lines of every DP rank with other output between them, and (from SGLang 0.5.13 on) an
    overflow assertion: the lines, the traffic, the overflow's window -> its need."""
    traffic_lines = random_traffic(minutes, seed, start_s)
    lines = log.start(start_s - 30, chunked_prefill_size=4096) if log.args == "dict" else log.start(start_s - 30)
    for index, (at, dp, running) in enumerate(traffic_lines):
        lines += log.decode(at, running, rank(dp))
        if index % 7 == 0:
            lines += log.record(at, [NOISE[index % 2]], rank(dp))
    overflows = {}
    if overflow:
        crash_at = start_s + minutes * 60 + 5
        lines += log.record(crash_at, sg.overflow_traceback(6144, 4096), rank(3))
        overflows[int(crash_at // 60)] = 6144
    return lines, traffic_lines, overflows


@pytest.mark.parametrize("log", sg.FORMATS, ids=lambda log: log.name)
def test_every_format_reads_with_the_exact_group_peak_of_every_window(tmp_path, log):
    lines, traffic_lines, overflows = format_log(log)
    read_back = read([write(tmp_path / "server.log", lines)], cap=4096)
    segment, = read_back.segments
    if log.stamp == "time":  # no date: the first line's day is day 0 (1970-01-01)
        day = T0 // 86_400 * 86_400
        traffic_lines = [(at - day, dp, running) for at, dp, running in traffic_lines]
        overflows = {index - int(day // 60): tokens for index, tokens in overflows.items()}
    assert segment.history.to_dict() == expected_history(traffic_lines, 4096, overflows=overflows).to_dict()
    assert read_back.decode_lines == len(traffic_lines) and read_back.overflow_lines == 1
    assert read_back.args_lines == 1 and read_back.unusable_lines == read_back.unplaced_lines == 0
    assert read_back.args_unread == 0
    if log.layout != "formatter":  # sglang#4592's formatter shows no rank tags
        assert segment.dp_peak_tokens[3] == 6144  # the overflow's rank, from its record's first line
        decode_ranks = {dp: tokens for dp, tokens in segment.dp_peak_tokens.items() if dp != 3}
        assert max(decode_ranks, key=decode_ranks.get) == 5
    assert read_back.undated_files == ([str(tmp_path / "server.log")] if log.stamp == "time" else [])


@pytest.mark.parametrize("log", sg.FORMATS, ids=lambda log: log.name)
def test_the_docs_list_every_format_with_its_releases_and_a_public_example(log):
    table = DOCS.read_text()
    row = next((line for line in table.splitlines() if line.startswith(f"| `{log.name}`")), None)
    assert row is not None, f"docs/sglang-logs.md has no row for {log.name}"
    assert log.example.split("://")[-1] in row


@pytest.mark.parametrize("log", [log for log in sg.FORMATS if log.wrapper in ("", "kubectl") and log.stamp != "time"],
                         ids=lambda log: log.name)
def test_wrapped_and_gzipped_copies_read_as_the_plain_log(tmp_path, log):
    """A runtime's stamps are UTC while SGLang's are local time: the reader keeps to SGLang's, so a wrapped copy
    of a log and the plain one give the same windows. (A time-only stamp takes the wrapper's date: below.)"""
    lines, traffic_lines, overflows = format_log(log, minutes=12, overflow=False)
    plain = read([write(tmp_path / "plain.log", lines)], cap=4096)
    packed = read([write(tmp_path / "server.log.1.gz", lines, gz=True)], cap=4096)
    assert packed.segments[0].history.to_dict() == plain.segments[0].history.to_dict()
    for wrapper in ("kubectl", "cri", "docker", "ray"):
        wrapped = sg.LogFormat(log.name, "", "", log.shape, log.stamp, log.layout, wrapper, log.args)
        lines, _, _ = format_log(wrapped, minutes=12, overflow=False)
        result = read([write(tmp_path / f"{wrapper}.log", lines)], cap=4096)
        assert result.segments[0].history.to_dict() == plain.segments[0].history.to_dict(), wrapper


@pytest.mark.parametrize("variant", [
    {}, {"pool": "swa"}, {"pool": "mamba"}, {"pool": "hisparse"}, {"accept_length": 3.1}, {"pd_decode": True},
    {"batch_iter": 1234}, {"mfu": True}, {"occupancy": True}, {"can_run_cuda_graph": False},
    {"graph_label": "npu graph"}, {"graph_label": "musa graph"}, {"shape": "dot"}, {"shape": "dot-iter"},
    {"mfu": True, "accept_length": 1.5, "pd_decode": True, "pool": "swa"},
], ids=lambda v: ",".join(f"{k}={v}" for k, v in v.items()) or "plain")
def test_every_decode_line_variant_is_read_and_agrees_with_sglangs_own_regex(tmp_path, variant):
    pattern = re.compile(sg.SGLANG_DECODE_PATTERN)
    log = sg.FORMATS[0]
    lines = log.start(T0 - 30)
    expected = []
    for index in range(200):
        running = (index * 37) % 300 + 1
        at = T0 + index * 0.5
        text = sg.line(at, sg.decode_message(running, **variant), rank(index % DP))
        lines.append(text)
        expected.append(running)
        theirs = pattern.search(text)
        if theirs is not None:  # SGLang's regex needs a "," after #queue-req: only lines with a suffix match
            assert int(theirs["num_running_req"]) == running and int(theirs["dp_rank"]) == index % DP
            assert theirs["time"] == sg.stamp(at)
    result = read([write(tmp_path / "v.log", lines)])
    assert result.decode_lines == 200 and result.unusable_lines == 0
    assert result.segments[0].history.max_peak_runtime_tokens == max(expected)


def test_prefix_parts_milliseconds_pipeline_and_actors_in_one_file(tmp_path):
    """Lines of different shapes in one file (SGLang's parts appear only when their size > 1): each is read."""
    lines = sg.FORMATS[0].start(T0 - 30)
    lines += [sg.line(T0 + 1.5, sg.decode_message(10), rank(0), log_ms=True),
              sg.line(T0 + 2, sg.decode_message(20), sg.Rank(dp=1, pp=0, tp=1, ep=1)),
              "(SchedulerActor pid=4242, ip=10.0.0.7) " + sg.line(T0 + 3, sg.decode_message(30), rank(2)),
              sg.line(T0 + 4, sg.decode_message(40), sg.Rank(dp=3, attn_cp=0, moe_dp=1, tp=3, ep=3))]
    result = read([write(tmp_path / "p.log", lines)])
    assert result.decode_lines == 4 and result.unusable_lines == 0
    assert result.segments[0].history.max_peak_runtime_tokens == 40
    assert result.segments[0].dp_peak_tokens == {3: 40}  # MOE_DP1 is not DP rank 1
    theirs = re.compile(sg.SGLANG_DECODE_PATTERN)
    assert theirs.search(lines[3] + ",")["pid"] == "4242"  # theirs allows the actor too
    # theirs expects PP after EP, but configure_scheduler_process writes it after DP: theirs misses it
    assert theirs.search(lines[2] + ",") is None


def test_time_only_stamps_roll_over_midnight(tmp_path):
    """2024's '[23:59:10 TP0]' has no date: days are counted, rolling over when the time of day goes back."""
    log = next(log for log in sg.FORMATS if log.stamp == "time")
    start = T0 + 11 * 3600 + 50 * 60  # 2025-11-30 23:50: twenty minutes across midnight
    traffic_lines = traffic(20, lambda m, s, d: 10 + m, start_s=start)
    lines = log.start(start - 30) + decode_lines(log, traffic_lines)
    segment, = read([write(tmp_path / "old.log", lines)], cap=4096).segments
    history = segment.history
    assert history.sample_count == 20 and history.max_peak_runtime_tokens == 29
    days = sorted(history.daily)
    assert len(days) == 2 and days[1] == days[0] + 1  # ten minutes on each side of midnight
    assert [history.daily[day][1] for day in days] == [10, 10]
    # the same lines with dates give the same windows, shifted to their real day
    dotted = sg.FORMAT["dotted"]
    dated = read([write(tmp_path / "new.log", dotted.start(start - 30) + decode_lines(dotted, traffic_lines))],
                 cap=4096).segments[0].history
    assert sorted(dated.daily.values()) == sorted(history.daily.values())


def test_a_time_only_stamp_inside_a_dated_wrapper_takes_the_wrappers_date(tmp_path):
    """kubectl --timestamps around a 2024 line: the runtime's UTC date dates SGLang's local time of day,
    on the nearest day (here the server's clock is 8 h behind UTC, so late evening is the previous UTC day)."""
    log = sg.LogFormat("time-in-kubectl", "", "", shape="dot", stamp="time", wrapper="kubectl", args="repr-0.5.13")
    start = T0 + 11 * 3600 + 55 * 60  # 23:55 local = 07:55 UTC the next day
    traffic_lines = traffic(10, lambda m, s, d: 5 + m, start_s=start)
    lines = log.start(start - 30) + decode_lines(log, traffic_lines)
    result = read([write(tmp_path / "k.log", lines)], cap=4096)
    assert result.undated_files == []
    assert result.segments[0].history.to_dict() == expected_history(traffic_lines, 4096).to_dict()


def test_overflow_assertions_of_every_release(tmp_path):
    """0.5.19+: R and the cap in use; 0.5.13-0.5.18: FlashInfer's bare assertion (no numbers: the window
    overflowed); 0.5.16+: the local batch N overran R (the step needed N)."""
    log = sg.FORMATS[0]
    events = [(at, log.decode(at, running, rank(dp))) for at, dp, running in traffic(10, lambda m, s, d: 100)]
    for minute, form in ((2, "geometry"), (5, "flashinfer"), (8, "recv")):
        at = T0 + minute * 60 + 30.001
        events.append((at, log.record(at, sg.overflow_traceback(6000, 4096, form, local_tokens=7000), rank(minute))))
    lines = log.start(T0 - 30) + [line for _, record in sorted(events, key=lambda event: event[0]) for line in record]
    result = read([write(tmp_path / "o.log", lines)])
    segment, = result.segments
    assert result.overflow_lines == 3 and result.unusable_lines == 0 and segment.history.overflow_windows == 3
    assert segment.cap_seen == 4096 and segment.history.max_peak_runtime_tokens == 7000
    assert segment.dp_peak_tokens[2] == 6000 and segment.dp_peak_tokens[8] == 7000


def test_real_sglang_0_5_18_and_0_5_13_server_args_reprs_read():
    """The recorded reprs (tests/support/data) of the released ServerArgs read to SGLang's own rules."""
    from capwatch.sglang_logs.server_args import read_server_args

    for release, decode_bs in (("0.5.18", 32), ("0.5.13", 32)):
        text = sg.server_args_repr(release).removeprefix("server_args=")
        config = read_server_args(text)
        assert (config.tp_size, config.ep_size, config.attn_dp_size) == (2, 2, 2)
        assert config.moe_a2a_backend == "flashinfer" and config.model_path == "deepseek-ai/DeepSeek-V3"
        assert config.limits.max_prefill_buffer_tokens == 1024 and config.default_cap == 4096
        assert config.limits.decode_cuda_graph_max_batch_size == decode_bs
        changed = read_server_args(sg.server_args_repr(release, decode_max_bs=96, chunked_prefill_size=8192,
                                                       speculative_algorithm="EAGLE",
                                                       speculative_num_draft_tokens=4).removeprefix("server_args="))
        assert changed.limits.decode_cuda_graph_max_batch_size == 96 and changed.default_cap == 8192
        assert changed.tokens_per_request == 4


def test_a_log_with_many_chunks_reads_like_one_chunk(tmp_path):
    """Chunk and block boundaries fall anywhere: a tiny chunk size gives the same history."""
    from capwatch.sglang_logs.log_file import LogFile

    lines, _, _ = format_log(sg.FORMATS[0], minutes=20)
    path = write(tmp_path / "c.log", lines)
    whole = read([path], cap=4096)
    small = [record for record in LogFile(path, 0, path, 60.0, chunk_bytes=4096).records()]
    big = [record for record in LogFile(path, 0, path, 60.0).records()]

    def windows(records):
        folded: dict[int, list[int]] = {}
        for record in records:
            if record[1] == 1:
                entry = folded.setdefault(record[3], [0, 0])
                entry[0], entry[1] = max(entry[0], record[4]), entry[1] + record[6]
        return folded

    assert windows(small) == windows(big)
    assert read_logs([path], cap=4096).segments[0].history.to_dict() == whole.segments[0].history.to_dict()
