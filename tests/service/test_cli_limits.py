"""The hardening issue's CLI inputs, as real processes: each ends in one line and exit 2 (never a
traceback, never unbounded work), and the limits are stated in --help."""

from __future__ import annotations

import pytest

from tests.service.test_cli_errors import assert_one_line_usage_error, capwatch

DIGITS = "9" * 5000
PLAN = ["plan", "--model", "deepseek-v3", "--ep-size", "8"]


@pytest.mark.parametrize(("args", "env", "names"), [
    ([*PLAN, "--budget", DIGITS], {}, ["--budget", "5000 characters"]),
    ([*PLAN, "--cap", DIGITS], {}, ["--cap", "5000 characters"]),
    (["plan", "--hidden-size", str(10**12), "--top-k", "8", "--num-experts", "256", "--ep-size", "8", "--cap", "1024"],
     {}, ["hidden_size", "65536"]),
    ([*PLAN, "--cap", "1024", "--eplb-stats-experts", str(10**9)], {}, ["eplb_stats_num_experts", "256"]),
    ([*PLAN, "--cap", "1024", "--flashinfer-version", "0.7.4", "--lamport-tokens", str(10**12)], {}, ["Lamport", "512"]),
    ([*PLAN, "--cap", "1024", "--flashinfer-version", "9.9.9"], {}, ["9.9.9"]),
    (["serve", "--db", "a" * 5000], {}, ["--db", "too long"]),
    (["serve"], {"CAPWATCH_WINDOW_S": "inf"}, ["CAPWATCH_WINDOW_S", "86400"]),
    (["serve"], {"CAPWATCH_RETENTION_S": "1e300"}, ["CAPWATCH_RETENTION_S"]),
])
def test_absurd_inputs_are_one_line_and_exit_2(tmp_path, args, env, names):
    result = capwatch(tmp_path, *args, env=env)
    line = assert_one_line_usage_error(result, args[0], *names)
    assert len(line) < 600, line
    assert not (tmp_path / "capwatch.db").exists()


def test_plan_help_states_the_limits(tmp_path):
    result = capwatch(tmp_path, "plan", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for limit in ("1..65536", "0..512", "0..num_experts", "1..64"):
        assert limit in text, limit
