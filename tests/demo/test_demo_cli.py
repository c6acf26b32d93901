"""``capwatch demo`` end to end, as real subprocesses: service, gloo ranks, reports, advice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from importlib import resources

import pytest
from capwatch.service.api.routes.web import DOCS_LINK_SLOT

from capwatch.demo.session import DEMO_ADVISOR_SETTINGS
from capwatch.demo.workload import WorkloadSpec, generate_token_counts
from tests.demo.conftest import final_reports, free_port, free_port_block, get_json, write_timed_trace
from tests.support import launcher
from tests.support.launcher import run_capwatch
from tests.support.service import ServiceProcess

ENV_VAR = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
            if all(found.get(key) == value for key, value in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels} in:\n{text[:2000]}")


def assert_quiet(stderr: str) -> None:
    """No warning a user cannot act on (torch once printed "Failed to initialize NumPy" per process)."""
    assert "NumPy" not in stderr and "Warning" not in stderr and "warn" not in stderr.lower(), stderr


def test_demo_json_with_embedded_service_and_hold(tmp_path):
    """Two ranks replay a paced 18 s trace (past the demo's 15 s of low confidence, so a lower can be advised); the
    demo, started in a folder outside the checkout, starts its own
    service, prints only the advice JSON, then holds: the page (``/`` and ``/web/app.js``, the package's files),
    the service's gauges and each rank's exporter (on B + r) answer."""
    counts = generate_token_counts(WorkloadSpec(ranks=2, steps=72, peak_tokens_per_rank=96, day_steps=48,
                                                mean_decode_steps=10, seed=5))
    trace = write_timed_trace(tmp_path / "trace.jsonl", counts, seconds_per_step=0.25)
    metrics_base, port = free_port_block(2), free_port()
    process = launcher.start(
        "-m", "capwatch", "demo", "--json", "--trace", str(trace), "--cap", "2048", "--port", str(port),
        "--metrics-port", str(metrics_base), "--state-dir", str(tmp_path / "state"), "--cluster", "embedded",
        "--hold", "8", cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        line = process.stdout.readline()  # the advice: one JSON object on one line, as advise --format json
        assert line, process.stderr.read()
        advice = json.loads(line)  # only the advice object on stdout

        # Holding: the service and both exporters are still up.
        service = f"http://127.0.0.1:{port}"
        web = resources.files("capwatch.service").joinpath("web")  # the page: the package's own files
        page = web.joinpath("index.html").read_text().replace(DOCS_LINK_SLOT, "")
        for path, expected in (("/?cluster=embedded", page), ("/web/app.js", web.joinpath("app.js").read_text())):
            with urllib.request.urlopen(f"{service}{path}", timeout=10) as response:
                assert response.status == 200 and response.read().decode() == expected, path
        with urllib.request.urlopen(f"{service}/metrics", timeout=10) as response:
            gauges = response.read().decode()
        assert metric_value(gauges, "capwatch_recommended_cap_tokens", ep_group="embedded") == advice["recommended_cap"]
        for rank in (0, 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_base + rank}/metrics", timeout=10) as response:
                exported = response.read().decode()
            assert metric_value(exported, "moe_a2a_forward_steps_total", ep_rank=str(rank)) == len(counts)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.stdout.close()
        process.stderr.close()

    assert advice["cluster"] == "embedded" and advice["current_cap"] == 2048
    peak = max(max(step) for step in counts)
    assert advice["max_peak_runtime_tokens"] == peak  # the service saw the trace's true R
    assert advice["action"] == "lower", advice["reasons"]
    assert peak <= advice["recommended_cap"] < 2048 and advice["recommended_cap"] % 128 == 0
    assert advice["env"] == f"{ENV_VAR}={advice['recommended_cap']}"
    assert advice["workspace_bytes_group_delta"] < 0
    assert (tmp_path / "state" / "demo.sqlite3").exists()
    assert final_reports(tmp_path / "state" / "demo.sqlite3", "embedded") == {0: 1, 1: 1}  # one each, the last


def test_overflow_raise_exits_nonzero_after_the_final_report(tmp_path, service, service_process):
    """R = 300 > cap 128 at step 3: every rank raises with the dispatcher's message; the service
    started by the test holds each rank's final report with the overflow counted."""
    counts = [[40, 60], [80, 70], [100, 120], [300, 90], [50, 50]]
    trace = write_timed_trace(tmp_path / "overflow.jsonl", counts, seconds_per_step=0.05)
    result = run_capwatch("demo", "--trace", str(trace), "--cap", "128", "--overflow-policy", "raise",
                          "--service-url", service, "--cluster", "overflowing",
                          "--metrics-port", str(free_port_block(2)))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert ENV_VAR in result.stderr and "needs 300 tokens" in result.stderr
    assert f"{ENV_VAR}=384" in result.stderr  # the dispatcher's suggested cap, aligned to 128
    assert "[target dispatcher, EP rank 0/2]" in result.stderr  # the whole message, not eaten as markup
    assert "Traceback" not in result.stderr
    assert_quiet(result.stderr)
    view = get_json(f"{service}/v1/clusters/overflowing")
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1]
    for rank in view["ranks"]:
        assert rank["final"] is True
        assert rank["overflow_events_total"] == 1
        assert rank["forward_steps_total"] == 4  # three steps dispatched, the fourth counted as it raised
        assert rank["max_runtime_tokens"] == 300
    assert final_reports(service_process.db_path, "overflowing") == {0: 1, 1: 1}  # nothing follows the final one


def test_chunk_replays_a_trace_far_above_the_cap_without_a_rank_dying(tmp_path, service, service_process):
    """``capwatch demo --trace T --cap 256 --overflow-policy chunk`` on an untimed trace whose R runs near 860
    (issue 36: ranks died of ``max_local_tokens 544 exceeds peak_runtime_tokens 257``). R's running max is set
    by the first step (900), so later intervals read R at the over-cap floor 257, while rank 0's own batch
    grows to 544 and 600 in them: every interval must still be a valid report and every rank finish."""
    counts = [[100, 900]] + [[300, 860]] * 24 + [[544, 860]] * 24 + [[600, 850]] * 24
    trace = tmp_path / "untimed.jsonl"
    trace.write_text("".join(json.dumps({"tokens": step}) + "\n" for step in counts))
    result = run_capwatch("demo", "--trace", str(trace), "--cap", "256", "--overflow-policy", "chunk",
                          "--service-url", service, "--cluster", "chunked-far-above",
                          "--metrics-port", str(free_port_block(2)))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "ValidationError" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    view = get_json(f"{service}/v1/clusters/chunked-far-above")
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1]
    for rank in view["ranks"]:
        assert rank["forward_steps_total"] == len(counts)  # every step reported, none lost to a dead rank
        assert rank["max_runtime_tokens"] == 900
        assert rank["overflow_events_total"] == len(counts)  # every step chunked
    assert final_reports(service_process.db_path, "chunked-far-above") == {0: 1, 1: 1}


@pytest.mark.parametrize("arguments, words", [
    (["--trace", "{bad}"], '{bad}:2: "tokens"[1] must be an integer'),
    (["--trace", "{two}", "--ranks", "3"], "the trace, which has 2 ranks"),
    (["--trace", "{missing}"], "does not exist"),
    (["--cap", "0"], "expected a positive integer"),
    (["--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--service-url", "localhost:1"], "must look like http://host:port"),
    (["--cluster", "no spaces"], "--cluster 'no spaces'"),
    (["--overflow-policy", "explode"], "invalid choice"),
])
def test_usage_errors_exit_2_and_start_nothing(tmp_path, capsys, arguments, words):
    from capwatch.cli import main

    paths = {"bad": tmp_path / "bad.jsonl", "two": tmp_path / "two.jsonl", "missing": tmp_path / "missing.jsonl"}
    paths["bad"].write_text('{"tokens": [1, 2]}\n{"tokens": [1, "x"]}\n')
    paths["two"].write_text('{"tokens": [1, 2]}\n')
    arguments = [argument.format(**paths) for argument in arguments]
    words = words.format(**paths)
    try:
        code = main(["demo", "--state-dir", str(tmp_path / "state"), *arguments])
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    assert code == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


@pytest.mark.parametrize("arguments, words", [
    (["--steps", str(10**12)], "--steps: expected a number of steps in 1..100000"),
    (["--steps", "9" * 5000], "--steps: expected a number of steps in 1..100000"),
    (["--trace", "/dev/zero"], "/dev/zero:1: longer than 65,536 characters"),
    (["--state-dir", "{file}"], "--state-dir {file}: not a folder the demo can write to"),
    (["--state-dir", "/proc/capwatch-demo"], "--state-dir /proc/capwatch-demo: not a folder the demo can write to"),
    (["--state-dir", "/proc"], "--state-dir /proc: not a folder the demo can write to"),
])
def test_hostile_inputs_are_one_line_and_exit_2(tmp_path, arguments, words):
    """Each once gave a traceback or unbounded work (issue 13): now one line, exit 2, quickly."""
    state_file = tmp_path / "a-file"
    state_file.write_text("not a folder")
    arguments = [argument.format(file=state_file) for argument in arguments]
    words = words.format(file=state_file)
    trace = write_timed_trace(tmp_path / "short.jsonl", [[1, 2]], seconds_per_step=0.1)
    if "--trace" not in arguments:
        arguments += ["--trace", str(trace)]
    started = time.monotonic()
    result = run_capwatch("demo", *arguments, "--port", str(free_port()), timeout_s=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert time.monotonic() - started < 60
    assert state_file.read_text() == "not a folder"


def test_the_limits_are_stated_in_help():
    text = " ".join(run_capwatch("demo", "--help", timeout_s=60).stdout.split())  # argparse wraps lines
    assert "--steps STEPS decode steps, at most 100,000" in text
    assert "(at most 100,000 steps, 65,536 characters a line, t up to 3,600 s, 1,048,576 tokens per rank)" in text


def test_a_usage_error_in_a_real_process_has_no_traceback(tmp_path):
    result = run_capwatch("demo", "--trace", str(tmp_path / "missing.jsonl"), timeout_s=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"capwatch demo: error: trace file {tmp_path / 'missing.jsonl'} does not exist"


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_ranks_and_service(tmp_path, signal_number):
    """Ctrl-C (or SIGTERM) mid-run: exit 130 promptly, no traceback, no process of the demo left."""
    port = free_port()
    process = launcher.start(
        "-m", "capwatch", "demo", "--json", "--ranks", "2", "--steps", "5000", "--port", str(port),
        "--metrics-port", str(free_port_block(2)), "--state-dir", str(tmp_path / "state"), "--cluster", "stopped",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # As from a terminal: a test run started in the background of a script (nohup ... &) ignores SIGINT, and
        # a child inherits that (POSIX), so Ctrl-C would never reach the demo whatever the demo does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the ranks are reporting mid-run
            try:
                if any(summary["cluster"] == "stopped" for summary in get_json(f"http://127.0.0.1:{port}/v1/clusters")):
                    break
            except OSError:
                pass
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.3)
        else:
            pytest.fail("the ranks never reported")
        process.send_signal(signal_number)
        assert process.wait(timeout=30) == 130
        assert "Traceback" not in process.stderr.read()
        time.sleep(1)
        listing = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(process.pid)], capture_output=True,
                                 text=True).stdout.splitlines()
        # Ranks and multiprocessing helpers: none alive (a dead one awaiting its reaper, init, is state Z).
        alive = [line for line in listing if line.split()[1][0] != "Z"]
        assert alive == [], alive
        with pytest.raises(OSError):  # the service (its own session) is stopped too
            get_json(f"http://127.0.0.1:{port}/healthz")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.stdout.close()
        process.stderr.close()


def test_reports_carry_the_token_a_protected_service_requires(tmp_path):
    trace = write_timed_trace(tmp_path / "short.jsonl", [[10, 20], [30, 5], [7, 7]], seconds_per_step=0.1)
    with ServiceProcess(tmp_path / "protected.db", env={"CAPWATCH_TOKEN": "s3cret-token", **DEMO_ADVISOR_SETTINGS}) as service:
        process = run_capwatch("demo", "--json", "--trace", str(trace), "--service-url", service.url,
                               "--cluster", "protected", "--metrics-port", str(free_port_block(2)),
                               env={"CAPWATCH_TOKEN": "s3cret-token"})
        assert process.returncode == 0, process.stderr
        view = get_json(f"{service.url}/v1/clusters/protected")
    assert all(rank["forward_steps_total"] == 3 and rank["final"] for rank in view["ranks"])
    assert "s3cret-token" not in process.stdout + process.stderr
    assert_quiet(process.stderr)


def test_metrics_port_zero_is_any_block_of_free_ports():
    """--metrics-port 0 once meant rank r on port r: port 0 (any) for rank 0, port 1 for rank 1."""
    import socket

    from capwatch.demo.session import choose_metrics_base

    base = choose_metrics_base(0, 4)
    assert 1024 < base and base + 3 <= 65_535
    probes = [socket.socket() for _ in range(4)]
    try:
        for offset, probe in enumerate(probes):
            probe.bind(("127.0.0.1", base + offset))  # all four are free
    finally:
        for probe in probes:
            probe.close()
