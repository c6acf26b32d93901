"""``capwatch demo`` end to end, as real subprocesses: service, gloo ranks, reports, advice."""

from __future__ import annotations

import json

import pytest

from capwatch.workload import WorkloadSpec, generate_token_counts
from tests.demo.conftest import free_port_block, get_json, run_capwatch, write_timed_trace

ENV_VAR = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def test_demo_json_with_embedded_service(tmp_path):
    """Two ranks replay a paced 12 s trace; the demo starts its own service and prints its advice."""
    counts = generate_token_counts(WorkloadSpec(ranks=2, steps=48, peak_tokens_per_rank=96, day_steps=48,
                                                mean_decode_steps=10, seed=5))
    trace = write_timed_trace(tmp_path / "trace.jsonl", counts, seconds_per_step=0.25)
    result = run_capwatch("demo", "--json", "--trace", str(trace), "--cap", "2048", "--port", "0",
                          "--metrics-port", str(free_port_block(2)), "--state-dir", str(tmp_path / "state"),
                          "--cluster", "embedded")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)  # only the advice object on stdout
    assert advice["cluster"] == "embedded" and advice["current_cap"] == 2048
    peak = max(max(step) for step in counts)
    assert advice["max_peak_runtime_tokens"] == peak  # the service saw the trace's true R
    assert advice["action"] == "lower", advice["reasons"]
    assert peak <= advice["recommended_cap"] < 2048 and advice["recommended_cap"] % 128 == 0
    assert advice["env"] == f"{ENV_VAR}={advice['recommended_cap']}"
    assert advice["workspace_bytes_group_delta"] < 0
    assert (tmp_path / "state" / "demo.sqlite3").exists()


def test_overflow_raise_exits_nonzero_after_the_final_report(tmp_path, service):
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
    assert "[target dispatcher, rank 0/2]" in result.stderr  # the whole message, not eaten as markup
    assert "Traceback" not in result.stderr
    view = get_json(f"{service}/v1/clusters/overflowing")
    assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1]
    for rank in view["ranks"]:
        assert rank["final"] is True
        assert rank["overflow_events_total"] == 1
        assert rank["forward_steps_total"] == 4  # three steps dispatched, the fourth counted as it raised
        assert rank["max_runtime_tokens"] == 300


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


def test_a_usage_error_in_a_real_process_has_no_traceback(tmp_path):
    result = run_capwatch("demo", "--trace", str(tmp_path / "missing.jsonl"), timeout_s=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"capwatch demo: error: trace file {tmp_path / 'missing.jsonl'} does not exist"
