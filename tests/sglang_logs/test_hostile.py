"""Hostile logs: bounded memory whatever a line's length or the number of args lines, every malformed stamp or
number counted (never a traceback), text that only looks like an args line skipped."""

from __future__ import annotations

import json
import random

import pytest
from capwatch.sglang_logs.log_file import MAX_LINE_BYTES
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sglang_logs.logs import (DP, T0, advise, decode_lines, every_line_counted_once, rank, read,
                                    read_description, traffic, write)
from tests.support import launcher
from tests.support import sglang_logs as sg

LOG = sg.FORMAT["sglang-0.5.19+"]
_PEAK_RSS = ("import resource, subprocess, sys\n"
             "result = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=600)\n"
             "print(result.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.stderr.write(result.stderr)\n"
             "sys.stdout.write(result.stdout)\n")


def advise_measured(*args: str) -> tuple[int, int, str, str]:
    """(exit status, peak RSS in bytes, stderr, stdout) of `capwatch advise` run in a child process."""
    measured = launcher.run("-c", _PEAK_RSS, launcher.PYTHON, "-m", "capwatch", "advise", *args, timeout_s=900)
    first, _, rest = measured.stdout.partition("\n")
    returncode, peak_kib = map(int, first.split())
    return returncode, peak_kib * 1024, measured.stderr, rest


def normal_log(minutes: int = 60, running: int = 100) -> list[str]:
    return LOG.start(T0 - 30) + decode_lines(LOG, traffic(minutes, lambda m, s, d: running - d))


def test_a_logged_prompt_with_server_args_in_it_is_skipped(tmp_path):
    """Issue #17 item 4: --log-requests logs a prompt that holds the text server_args={ (even a whole, valid
    dict): it is counted as not the start-up line, and the log reads as without it."""
    prompt = sg.line(T0 + 30, "Receive: obj=GenerateReqInput(text=['Explain: server_args={\\'tp_size\\': 1, "
                              "\\'ep_size\\': 1, \\'model_path\\': \\'evil\\'}'], rid=['1'])")
    finished = sg.line(T0 + 31, "Finish: obj=GenerateReqInput(rid='1'), out={'text': \"server_args={'tp_size': 1, "
                                "'ep_size': 1}\"}")
    broken = sg.line(T0 + 32, "Receive: obj=GenerateReqInput(text='server_args={', rid='2')")
    lines = normal_log()
    clean = read([write(tmp_path / "clean.log", lines)])
    dirty = read([write(tmp_path / "dirty.log", lines[:2] + [prompt, finished, broken] + lines[2:])])
    assert dirty.args_unread == 3 and dirty.args_lines == 1, dirty.examples
    assert "not SGLang's start-up line" in dirty.examples["args"][0]
    segment, = dirty.segments
    assert segment.config.tp_size == 8 and segment.history.to_dict() == clean.segments[0].history.to_dict()


def test_a_100_mb_line_and_binary_garbage_are_read_in_bounded_memory(tmp_path):
    """One 100 MB line (no newline for 100 MB), then binary garbage, then the real log: the line is dropped a
    chunk at a time and counted, so the reader's peak memory stays far below it; the advice is the log's."""
    path = tmp_path / "hostile.log"
    rng = random.Random(7)
    with open(path, "wb") as handle:
        block = b"x" * (1 << 20)
        for _ in range(100):
            handle.write(block)
        handle.write(b"\n")
        handle.write(bytes(rng.getrandbits(8) for _ in range(1 << 20)))
        handle.write(b"\n")
        handle.write(("\n".join(normal_log()) + "\n").encode())
    returncode, peak, stderr, stdout = advise_measured("--sglang-log", str(path), "--json")
    assert returncode == 0, stderr
    assert peak < 100 << 20, f"peak RSS {peak >> 20} MiB for a 100 MiB line: the line was kept"
    advice = json.loads(stdout)
    assert advice["max_peak_runtime_tokens"] == 100
    assert "unusable line(s) skipped" in read_description(advice["reasons"])
    assert f"more than {MAX_LINE_BYTES:,}" in read_description(advice["reasons"])


@pytest.mark.parametrize("megabytes, counted", [(15, "unusable line(s) skipped"), (2, "server_args= line(s) not read")])
def test_a_huge_args_line_is_refused_before_parsing_and_a_good_one_still_reads(tmp_path, megabytes, counted):
    """Issue #17 item 9: a 15 MB args line drove the reader past 6 GB. Longer than a line can be (4 Mi
    characters) it is dropped unread; longer than an args line can be (1 MiB) it is refused unparsed."""
    huge = sg.line(T0 - 40, "server_args={'tp_size': 8, 'junk': '" + "y" * (megabytes << 20) + "'}")
    path = write(tmp_path / "big-args.log", [huge] + normal_log())
    returncode, peak, stderr, stdout = advise_measured("--sglang-log", path, "--json")
    assert returncode == 0, stderr
    assert peak < 200 << 20, f"peak RSS {peak >> 20} MiB: the args line was parsed"
    assert counted in read_description(json.loads(stdout)["reasons"])
    alone = write(tmp_path / "only-big.log", [huge] + normal_log()[1:])
    returncode, _, stderr, _ = advise_measured("--sglang-log", alone)
    assert returncode == 2 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr


def test_many_alternating_args_lines_stay_bounded(tmp_path):
    """Issue #17 item 9: a flood of args lines, alternating between two configurations: each text parses once,
    the configurations stay two, memory stays flat."""
    first = sg.line(T0 - 30, "server_args={'tp_size': 8, 'ep_size': 8, 'moe_a2a_backend': 'flashinfer', "
                             "'model_path': 'deepseek-ai/DeepSeek-V3', 'chunked_prefill_size': 8192}")
    second = first.replace("8192", "4096")
    path = tmp_path / "flood.log"
    with open(path, "w") as handle:
        for block in range(100):
            handle.write(("\n".join([first, second] * 1000)) + "\n")
        handle.write("\n".join(decode_lines(LOG, traffic(30, lambda m, s, d: 50))) + "\n")
    result = read([str(path)])
    assert result.args_lines == 200_000 and len(result.segments) == 2
    assert sum(segment.starts for segment in result.segments) == 200_000
    returncode, peak, stderr, _ = advise_measured("--sglang-log", str(path), "--json")
    assert returncode == 0, stderr
    assert peak < 300 << 20


@pytest.mark.parametrize("line, kind", [
    (sg.line(T0 + 60, sg.decode_message(7)).replace("2025-11-30", "2026-13-01"), "unplaced"),
    (sg.line(T0 + 60, sg.decode_message(7)).replace("2025-11-30", "0000-11-30"), "unplaced"),
    (sg.line(T0 + 60, sg.decode_message(7)).replace("2025-11-30", "2025-02-30"), "unplaced"),
    (sg.line(T0 + 60, sg.decode_message(7)).replace("12:01:00", "25:61:00"), "unplaced"),
    (sg.line(T0 + 60, sg.decode_message(7)).replace("#running-req: 7", "#running-req: " + "9" * 5000), "unusable"),
    ("AssertionError: FlashInfer A2A runtime token geometry exceeds its fixed workspace: runtime_max_tokens_per_rank="
     + "9" * 5000 + " > max_num_tokens=4096", "unusable"),
    (sg.line(T0 + 60, "server_args={'tp_size': " + "9" * 4001 + "}"), "args"),
    (sg.line(T0 + 60, "server_args=ServerArgs(tp_size=1" + "0" * 4000 + ")"), "args"),
])
def test_malformed_stamps_and_numbers_are_counted_never_a_traceback(tmp_path, line, kind):
    lines = normal_log(30)
    path = write(tmp_path / "m.log", lines[:500] + [line] + lines[500:])
    result = read([path])
    counted = {"unplaced": result.unplaced_lines, "unusable": result.unusable_lines, "args": result.args_unread}
    assert counted[kind] == 1 and sum(counted.values()) == 1
    assert result.segments[0].history.max_peak_runtime_tokens == 100
    cli = advise("--sglang-log", path, "--json")
    assert cli.returncode == 0 and "Traceback" not in cli.stderr, cli.stderr


def test_an_unstamped_line_above_the_peak_stops_the_advice(tmp_path):
    """A decode line whose time cannot be read but whose number can: below the peak it is named; above it there
    is no advice (the advice would size below a line that was read)."""
    lines = normal_log(30)
    bad = sg.line(T0 + 60, sg.decode_message(5000)).replace("2025-11-30", "2025-13-30")
    path = write(tmp_path / "u.log", lines[:500] + [bad] + lines[500:])
    cli = advise("--sglang-log", path)
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "5,000 tokens per rank, above the 100" in cli.stderr and "is not a real time" in cli.stderr


@settings(max_examples=60, deadline=None)
@given(garbage=st.lists(st.one_of(
    st.binary(max_size=120),
    st.builds(lambda y, mo, d, h, mi, s, n: f"[{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d} DP1] Decode batch, "
              f"#running-req: {n}, #token: 1".encode(),
              st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99),
              st.integers(0, 99), st.integers(0, 10 ** 12)),
    st.sampled_from([b"server_args={", b"server_args=ServerArgs(", b"AssertionError: runtime_max_tokens_per_rank=",
                     b"{\"log\":\"[2025-11-30 12:00:00] server_args={'tp_size'", b"\xff\xfe\x00", b"\r\r\n"])),
    max_size=40), seed=st.integers(0, 10_000))
def test_any_bytes_among_the_lines_are_counted_and_never_break_the_read(tmp_path_factory, garbage, seed):
    rng = random.Random(seed)
    lines = [line.encode() for line in normal_log(3)]
    for item in garbage:
        lines.insert(rng.randrange(1, len(lines) + 1), item)
    path = tmp_path_factory.mktemp("bytes") / "g.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = read([str(path)])
    assert every_line_counted_once(result)
    assert result.segments[0].decode_lines >= 3 * 30 * DP
    assert result.segments[0].history.max_peak_runtime_tokens >= 100


def test_a_binary_file_is_one_error_line(tmp_path):
    path = tmp_path / "core"
    path.write_bytes(bytes(random.Random(1).getrandbits(8) for _ in range(1 << 20)))
    cli = advise("--sglang-log", str(path))
    assert cli.returncode == 2 and "no SGLang decode lines" in cli.stderr and "Traceback" not in cli.stderr
    assert rank(0).dp == 0
