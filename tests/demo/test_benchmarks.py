"""The benchmark runner and the advice-quality evaluation (pure parts; no timing asserted)."""

from __future__ import annotations

import datetime as dt
import json

from benchmarks import advice_quality
from benchmarks.__main__ import available, machine, render_report
from tests.support import launcher


def test_runner_finds_benchmark_modules_and_rejects_unknown_names():
    assert "advice_quality" in available()
    result = launcher.run("-m", "benchmarks", "no_such_benchmark", imports_tests=True, timeout_s=120)
    assert result.returncode == 2 and "unknown benchmark 'no_such_benchmark'" in result.stderr
    assert "advice_quality" in result.stderr  # lists the choices


def test_runner_json_prints_one_object():
    result = launcher.run("-m", "benchmarks", "advice_quality", "--quick", "--json", imports_tests=True,
                          timeout_s=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert set(figures["policies"]) == {"static 4096", "KRR max x 1.15", "VPA p90 x 1.15", "capwatch"}


def test_report_names_the_machine_date_and_failures():
    results = {
        "advice_quality": {"figures": {"policies": {"a": {"overflow_steps": 1}, "b": {"overflow_steps": 0}},
                                       "median_ratio": 1.01}, "seconds": 1.0},
        "ingest": {"figures": {"bare": {"rate_per_s": 4000.0, "p99_ms": 20.0},
                               "capwatch": {"rate_per_s": 1800.0, "p99_ms": 90.0, "stored": 10}}, "seconds": 2.0},
        "plan_pricing": {"error": "RuntimeError: boom", "traceback": "Traceback ...\nRuntimeError: boom",
                         "seconds": 0.1},
    }
    info = machine()
    report = render_report(results, True, info, dt.datetime(2026, 11, 30, 5, 0, tzinfo=dt.timezone.utc))
    assert "2026-11-30 05:00 UTC" in report and "all --quick" in report
    assert f"| cpu cores | {info['cpu_cores']} |" in report and "| memory gib |" in report
    assert "| [plan_pricing](#plan-pricing) | failed: RuntimeError: boom |" in report
    assert "| a | 1 |" in report and "| median_ratio | 1.01 |" in report  # nested dicts become tables
    assert "| figure | bare | capwatch |" in report and "| rate_per_s | 4,000.0 | 1,800.0 |" in report
    assert "| stored |  | 10 |" in report  # side by side, blank where a server has no such figure


def test_advice_quality_counts_overflow_steps_per_policy():
    # Training: a calm 100 with one 400 burst; the test day bursts to 420 twice.
    day = 400
    train = [100] * (3 * day)
    train[500] = 400
    test = [100] * day
    test[50] = test[300] = 420
    rows = {row["policy"]: row for row in advice_quality.evaluate(train, test, day)}
    assert rows["static 4096"]["overflow_steps"] == 0
    assert rows["KRR max x 1.15"]["cap"] == 460 and rows["KRR max x 1.15"]["overflow_steps"] == 0
    assert rows["VPA p90 x 1.15"]["cap"] == 115 and rows["VPA p90 x 1.15"]["overflow_steps"] == 2
    ours = rows["capwatch"]
    assert ours["action"] == "lower" and ours["cap"] >= 460 and ours["cap"] % 128 == 0 and ours["overflow_steps"] == 0
    assert ours["workspace_gib_per_rank"] < rows["static 4096"]["workspace_gib_per_rank"]
