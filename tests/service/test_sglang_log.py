"""capwatch advise --sglang-log: SGLang 0.5.23 logs (written with SGLang's own format strings,
tests/support/sglang_logs.py) read into the advisor, cross-checked with SGLang's own regex."""

from __future__ import annotations

import gzip
import json
import random
import re
import subprocess

import pytest
from capwatch.service.advisor.advice import ClusterAdvice
from capwatch.sglang_logs.advise import advise_from_sglang_logs
from capwatch.sglang_logs.reader import _OPEN_WINDOWS, LogReader, read_logs
from capwatch.sglang_logs.server_args import parse_args_dict, server_config
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import launcher
from tests.support import sglang_logs as sg

T0 = 1_764_504_000.0  # 2025-11-30 12:00:00 UTC, a window start
DP = 8


def rank(dp: int) -> sg.Rank:
    return sg.Rank(dp=dp, tp=dp, ep=dp)


def decode_lines(minutes: int, running, start_s: float = T0, every_s: float = 2.0, **variant) -> list[str]:
    """One decode line per DP rank every ``every_s`` seconds; running(minute, second, dp) -> #running-req."""
    lines = []
    for minute in range(minutes):
        for second in range(0, 60, int(every_s)):
            for dp in range(DP):
                at = start_s + minute * 60 + second + dp * 0.01
                lines.append(sg.line(at, sg.decode_message(running(minute, second, dp), **variant), rank(dp),
                                     log_ms=variant.get("log_ms", False)) if "log_ms" not in variant else
                             sg.line(at, sg.decode_message(running(minute, second, dp)), rank(dp), log_ms=True))
    return lines


def write(path, lines: list[str], gz: bool = False):
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return str(path)


def args_line(at: float = T0 - 30, **args) -> str:
    return sg.line(at, sg.args_message(sg.server_args(**args)))


def read(paths: list[str], cap: int | None = None):
    return read_logs(paths, 60.0, 86_400.0, 1.2, 16, cap=cap)


def test_group_peak_per_window_is_the_max_over_dp_ranks_times_tokens_per_request(tmp_path):
    rng = random.Random(3)
    table = {(m, s, d): rng.randint(0, 120) + (60 if d == 5 else 0)  # DP rank 5 is the hot one
             for m in range(30) for s in range(0, 60, 2) for d in range(DP)}
    lines = [args_line()] + decode_lines(30, lambda m, s, d: table[m, s, d])
    segment, = read([write(tmp_path / "server.log", lines)]).segments
    expected = [max(v for (m, _, _), v in table.items() if m == minute) for minute in range(30)]
    assert segment.history.sample_count == 30
    assert segment.history.max_peak_runtime_tokens == max(expected)
    assert sorted(segment.history.daily.values()) == [[max(expected), 30]]
    assert max(segment.dp_peak_tokens, key=segment.dp_peak_tokens.get) == 5


def test_speculative_decoding_dispatches_every_draft_token(tmp_path):
    lines = [args_line(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_num_draft_tokens=4)]
    lines += decode_lines(20, lambda m, s, d: 50 + d, accept_length=2.7)
    segment, = read([write(tmp_path / "spec.log", lines)]).segments
    assert segment.config.tokens_per_request == 4
    assert segment.history.max_peak_runtime_tokens == 57 * 4
    assert segment.config.limits.decode_cuda_graph_max_batch_size == 256


VARIANTS = [
    {}, {"pool": "swa"}, {"pool": "mamba"}, {"pool": "hisparse"}, {"accept_length": 3.1}, {"pd_decode": True},
    {"batch_iter": 1234}, {"mfu": True}, {"occupancy": True}, {"can_run_cuda_graph": False},
    {"graph_label": "npu graph"}, {"mfu": True, "accept_length": 1.5, "pd_decode": True, "pool": "swa"},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v) or "plain")
def test_every_decode_line_variant_is_read_and_agrees_with_sglangs_own_regex(tmp_path, variant):
    pattern = re.compile(sg.SGLANG_DECODE_PATTERN)
    lines = [args_line()]
    expected = []
    for index in range(200):
        running = (index * 37) % 300
        at = T0 + index * 0.5
        text = sg.line(at, sg.decode_message(running, **variant), rank(index % DP))
        lines.append(text)
        expected.append(running)
        theirs = pattern.search(text)
        if theirs is not None:  # SGLang's regex needs a "," after #queue-req: only lines with a suffix match
            assert int(theirs["num_running_req"]) == running and int(theirs["dp_rank"]) == index % DP
            assert theirs["time"] == sg.stamp(at)
    log = read([write(tmp_path / "v.log", lines)])
    assert log.decode_lines == 200 and log.unusable_lines == 0
    assert log.segments[0].history.max_peak_runtime_tokens == max(expected)


def test_prefix_variants_milliseconds_pipeline_and_ray_actors(tmp_path):
    lines = [args_line()]
    lines += [sg.line(T0 + 1.5, sg.decode_message(10), rank(0), log_ms=True),
              sg.line(T0 + 2, sg.decode_message(20), sg.Rank(dp=1, pp=0, tp=1, ep=1)),
              "(SchedulerActor pid=4242, ip=10.0.0.7) " + sg.line(T0 + 3, sg.decode_message(30), rank(2)),
              sg.line(T0 + 4, sg.decode_message(40), sg.Rank(dp=3, attn_cp=0, moe_dp=1, tp=3, ep=3))]
    log = read([write(tmp_path / "p.log", lines)])
    assert log.decode_lines == 4 and log.unusable_lines == 0
    assert log.segments[0].history.max_peak_runtime_tokens == 40
    theirs = re.compile(sg.SGLANG_DECODE_PATTERN)
    assert theirs.search(lines[3] + ",")["pid"] == "4242"  # theirs allows the actor too
    # theirs expects PP after EP, but configure_scheduler_process writes it after DP: theirs misses it
    assert theirs.search(lines[2] + ",") is None


def test_overflow_assertions_are_overflow_windows_needing_their_R(tmp_path):
    lines = [args_line(chunked_prefill_size=2048)]
    lines += decode_lines(10, lambda m, s, d: 100)
    crash_at = T0 + 10 * 60 + 5
    lines += [sg.line(crash_at, message, rank(5)) if index == 0 else message
              for index, message in enumerate(sg.overflow_traceback(6144, 4096))]
    lines += [args_line(crash_at + 30, chunked_prefill_size=2048)]  # the restart: the same args
    lines += decode_lines(10, lambda m, s, d: 100, start_s=T0 + 12 * 60)
    log = read([write(tmp_path / "crash.log", lines)])
    segment, = log.segments  # same args: one configuration, started twice
    assert segment.starts == 2 and segment.overflow_lines == 1 and segment.cap_seen == 4096
    assert segment.history.overflow_windows == 1 and segment.history.max_peak_runtime_tokens == 6144
    assert segment.dp_peak_tokens[5] == 6144
    advice = advise_from_sglang_logs([str(tmp_path / "crash.log")]).advice
    assert advice.current_cap == 4096 and advice.action == "raise" and advice.recommended_cap > 6144
    assert "max_num_tokens of the log's overflow assertions" in advice.reasons[0]


def test_a_restart_with_new_args_starts_a_new_configuration(tmp_path):
    lines = [args_line(chunked_prefill_size=8192)] + decode_lines(30, lambda m, s, d: 300)
    lines += [args_line(T0 + 40 * 60, chunked_prefill_size=4096, decode_max_bs=128)]
    lines += decode_lines(30, lambda m, s, d: 90, start_s=T0 + 41 * 60)
    log = read([write(tmp_path / "two.log", lines)])
    first, second = log.segments
    assert first.history.max_peak_runtime_tokens == 300 and second.history.max_peak_runtime_tokens == 90
    assert second.config.default_cap == 4096 and first.config.default_cap == 8192
    advice = advise_from_sglang_logs([str(tmp_path / "two.log")]).advice
    assert advice.max_peak_runtime_tokens == 90 and advice.current_cap == 4096
    assert "latest of 2 configurations" in advice.reasons[0]


def test_rotated_and_gzipped_files_read_as_one_log(tmp_path):
    lines = [args_line()] + decode_lines(60, lambda m, s, d: (m * 7 + d * 3) % 200)
    whole = read([write(tmp_path / "all.log", lines)])
    parts = [write(tmp_path / "server.log.2.gz", lines[:4000], gz=True), write(tmp_path / "server.log.1", lines[4000:9000]),
             write(tmp_path / "server.log", lines[9000:])]
    rotated = read(parts)
    assert rotated.files == 3 and rotated.lines == whole.lines
    assert rotated.segments[0].history.to_dict() == whole.segments[0].history.to_dict()


def test_unusable_lines_are_counted_never_fatal(tmp_path):
    lines = [sg.line(T0 - 60, sg.decode_message(5), rank(0))]  # before any args line
    lines += [args_line(), "garbage \x00 line", sg.line(T0, "Prefill batch, #new-seq: 1, #new-token: 10")]
    lines += decode_lines(20, lambda m, s, d: 64)
    lines += [sg.line(T0 + 5, "Decode batch, #running-req: oops, #token: 1")[:60],  # truncated, not a number
              "AssertionError: FlashInfer A2A runtime token geometry exceeds its fixed workspace: runtime_max_tokens_per_rank=x"]
    log = read([write(tmp_path / "dirty.log", lines)])
    assert log.unusable_lines == 3 and log.skipped_lines == 2
    assert log.segments[0].history.max_peak_runtime_tokens == 64


def test_open_windows_stay_few_however_long_the_log():
    reader = LogReader(60.0, 86_400.0, 1.2, 16, cap=lambda config: 4096)
    reader.feed(args_line() + "\n")
    peak = 0
    for minute in range(0, 3000, 10):
        reader.feed("\n".join(decode_lines(10, lambda m, s, d: 10, start_s=T0 + minute * 60, every_s=20)) + "\n")
        peak = max(peak, len(reader._windows))
    assert peak <= _OPEN_WINDOWS + 11
    assert reader.finish().segments[0].history.sample_count == 3000


@pytest.mark.parametrize("chunk, expected_cap, mode, floor", [
    (16384, 16384, "null", 16384), (2048, 4096, "null", 2048), (8192, 8192, "decode", 256)])
def test_sglangs_default_cap_and_floor_rules(chunk, expected_cap, mode, floor):
    config = server_config(parse_args_dict(sg.args_message(sg.server_args(chunked_prefill_size=chunk,
                                                                             disaggregation_mode=mode))))
    assert config.default_cap == expected_cap
    from capwatch.service.advisor.floor import deployment_floor
    assert deployment_floor(config.limits, None).tokens == floor


def test_args_rules_max_running_requests_and_disabled_graphs():
    args = sg.server_args(decode_max_bs=512, max_running_requests=1024, attn_dp_size=8, prefill_backend="full",
                          prefill_max_bs=8192, chunked_prefill_size=4096)
    limits = server_config(args).limits
    assert limits.decode_cuda_graph_max_batch_size == 128  # min(512, 1024 // 8)
    assert limits.prefill_cuda_graph_max_batch_size == 8192
    assert server_config(sg.server_args(decode_backend="disabled")).limits.decode_cuda_graph_max_batch_size == 0
    assert server_config(sg.server_args(disaggregation_mode="prefill")).limits.decode_cuda_graph_max_batch_size == 0
    # a value whose repr is not a literal does not make the line unreadable
    text = sg.args_message(sg.server_args()).replace("'dtype': 'auto'", "'dtype': <DType.auto: 'auto'>")
    assert server_config(parse_args_dict(text)).tp_size == 8
    text = sg.args_message(sg.server_args(watchdog_timeout=float("inf"), mem_fraction_static=float("nan")))
    assert "inf" in text and server_config(parse_args_dict(text)).ep_size == 8
    assert len(parse_args_dict(sg.args_message(sg.server_args()))) >= 542  # every field SGLang declares


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return launcher.run_capwatch("advise", *args, timeout_s=120)


def test_cli_json_is_the_services_advice_object(tmp_path):
    lines = [args_line()] + decode_lines(120, lambda m, s, d: 40 + (m % 30) + d)
    path = write(tmp_path / "server.log", lines)
    result = run_cli("--sglang-log", path, "--json")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)
    assert set(advice) == set(ClusterAdvice.model_fields)
    assert advice["cluster"] == "server" and advice["current_cap"] == 8192  # chunked 8192: SGLang's default
    assert advice["floor_cap"] == 8192 and "prefill chunk" in advice["floor_binds"]
    assert advice["kv_bytes_per_token"] == (512 + 64) * 61 * 2  # DeepSeek-V3, MLA, bf16 KV
    table = run_cli("--sglang-log", path, "--cap", "16384")
    assert table.returncode == 0 and "capwatch advice" in table.stdout and "lower" in table.stdout


@pytest.mark.parametrize("content, message", [
    ("hello\nworld\n", "no SGLang decode lines"),
    (args_line() + "\n" + sg.line(T0, "Prefill batch, #new-seq: 1") + "\n", "no SGLang decode lines"),
    (sg.line(T0, "server_args={'tp_size': 8, 'model_path': ") + "\n", "server_args line cannot be read"),
    (args_line(model_path="/models/my-own-moe") + "\n" + "\n".join(decode_lines(3, lambda m, s, d: 1)) + "\n",
     "pass --model NAME"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "bad.log"
    path.write_text(content)
    result = run_cli("--sglang-log", str(path))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
    missing = run_cli("--sglang-log", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "is not a readable file" in missing.stderr


def test_a_truncated_gzip_log_is_one_line_and_exit_2(tmp_path):
    """A rotated log copied while it was still being written ends mid-stream: EOFError, not OSError."""
    import gzip

    lines = [args_line()] + decode_lines(120, lambda m, s, d: 40 + (m % 30) + d)
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    path = tmp_path / "server.log.1.gz"
    path.write_bytes(whole[: len(whole) // 2])
    result = run_cli("--sglang-log", str(path))
    assert result.returncode == 2 and "cannot read the log" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_file_without_newlines_is_read_in_bounded_memory(tmp_path):
    """Not a log at all (one 128 MiB line): dropped a chunk at a time and counted, so the reader's peak
    memory stays far below the file's size; then the usual one-line error."""
    from capwatch.sglang_logs.reader import MAX_LINE_CHARS

    size = 8 * MAX_LINE_CHARS
    path = tmp_path / "blob.log"
    with open(path, "w") as blob:
        for _ in range(size // (1 << 20)):
            blob.write("x" * (1 << 20))
    probe = ("import resource, subprocess, sys\n"
             "result = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)\n"
             "print(result.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.stderr.write(result.stderr)\n")
    measured = launcher.run("-c", probe, launcher.PYTHON, "-m", "capwatch", "advise", "--sglang-log", str(path),
                            timeout_s=300)
    returncode, peak_kib = map(int, measured.stdout.split())
    assert returncode == 2 and "no server_args= line" in measured.stderr, measured.stderr
    assert peak_kib * 1024 < size, f"peak RSS {peak_kib} KiB for a {size >> 20} MiB line: the line was kept"


def test_cli_whatif_prices_caps_with_predicted_overflows_per_day(tmp_path):
    lines = [args_line(disaggregation_mode="decode")] + decode_lines(180, lambda m, s, d: 200 + (m % 40) * 5 + d)
    path = write(tmp_path / "decode.log", lines)
    result = run_cli("--sglang-log", path, "--whatif", "128", "256", "512", "1024", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["cap"] for row in rows] == [128, 256, 512, 1024]
    per_day = [row["predicted_overflow_windows_per_day"] for row in rows]
    assert per_day[0] == pytest.approx(1440.0) and per_day == sorted(per_day, reverse=True)  # 128: every window
    assert rows[0]["below_floor"] and not rows[1]["below_floor"]  # PD decode: floor = decode graph 256 x 1
    assert all(row["predicted_overflow_windows_per_day_low"] <= row["predicted_overflow_windows_per_day"]
               <= row["predicted_overflow_windows_per_day_high"] for row in rows)


@settings(max_examples=60, deadline=None)
@given(noise=st.lists(st.text(min_size=0, max_size=80), max_size=30), seed=st.integers(0, 1000))
def test_any_mix_of_lines_is_read_without_error_and_every_line_is_counted(noise, seed):
    rng = random.Random(seed)
    lines = [args_line()] + decode_lines(3, lambda m, s, d: rng.randint(0, 50))
    for text in noise:
        lines.insert(rng.randrange(1, len(lines) + 1), text.replace("\n", " ").replace("\r", " "))
    reader = LogReader(60.0, 86_400.0, 1.2, 16, cap=lambda config: 4096)
    reader.feed("\n".join(lines) + "\n")
    log = reader.finish()
    assert log.lines == len(lines)
    assert log.decode_lines + log.args_lines + log.overflow_lines + log.unusable_lines + log.skipped_lines == log.lines
    assert log.decode_lines == 3 * 30 * DP


def test_a_large_log_shows_a_progress_bar_on_a_terminal_and_none_in_a_pipe(tmp_path):
    import os
    import pty

    from capwatch.commands.advise import PROGRESS_MIN_BYTES

    block = "\n".join(decode_lines(10, lambda m, s, d: 30 + d)) + "\n"
    path = tmp_path / "big.log"
    with open(path, "w") as handle:
        handle.write(args_line() + "\n")
        # the same ten minutes again and again: the copies come too late for their windows (counted as
        # unusable); what is tested is the bar
        for _ in range(PROGRESS_MIN_BYTES // len(block) + 2):
            handle.write(block)
    leader, follower = pty.openpty()
    try:
        result = launcher.run_capwatch("advise", "--sglang-log", str(path), "--json", stderr=follower, timeout_s=300)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert result.returncode == 0 and json.loads(result.stdout)["cluster"] == "big"
    assert b"reading SGLang logs" in shown  # the bar, on the terminal
    piped = run_cli("--sglang-log", str(path), "--json")
    assert piped.returncode == 0 and "reading SGLang logs" not in piped.stderr
