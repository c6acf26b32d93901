"""``capwatch plan --backend deepep`` run as a real process, the way a user runs it."""

from __future__ import annotations

import json
import subprocess

import pytest
from capwatch.sizing.deepep_low_latency import LOW_LATENCY_HIDDEN_SIZES
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import MODEL_PRESETS, custom_geometry, model_geometry

from tests.support.launcher import run_capwatch


def capwatch(*args: str) -> subprocess.CompletedProcess:
    return run_capwatch("plan", "--backend", "deepep", *args, env={"COLUMNS": "200"}, timeout_s=60)


def test_every_preset_deepep_runs_is_priced_as_the_planner_prices_it():
    for geometry in MODEL_PRESETS.values():
        result = capwatch("--model", geometry.name, "--ep-size", "8", "--cap", "64:1024:320", "--json")
        if geometry.hidden_size not in LOW_LATENCY_HIDDEN_SIZES:
            assert result.returncode == 2 and "do not run hidden size" in result.stderr, geometry.name
            continue
        assert result.returncode == 0, result.stderr
        plans = [json.loads(line) for line in result.stdout.splitlines()]  # JSON Lines: a plan each
        assert [plan["cap"] for plan in plans] == [64, 384, 704, 1024]
        assert [plan["buffer_bytes_per_rank"] for plan in plans] == [
            plan_deepep_buffer(geometry, 8, cap).buffer_bytes_per_rank for cap in (64, 384, 704, 1024)]


def test_deepseek_v3_in_both_modes_with_redundant_and_fused_shared_experts():
    auto = json.loads(capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "128", "--json").stdout)
    assert (auto["num_rdma_bytes"], auto["num_nvl_bytes"]) == (1_908_410_496, 335_709_824)
    assert auto["deepep_mode"] == "auto" and auto["buffer_experts"] == 256
    fused = json.loads(capwatch("--model", "deepseek-ai/DeepSeek-V3", "--ep-size", "16", "--cap", "128",
                                "--deepep-mode", "low_latency", "--redundant-experts", "32",
                                "--shared-experts-fusion", "--json").stdout)
    assert fused["buffer_experts"] == 256 + 32 + 16 and fused["num_nvl_bytes"] == 0
    assert fused["buffer_bytes_per_rank"] == plan_deepep_buffer(model_geometry("deepseek-v3"), 16, 128, "low_latency",
                                                                32, 1).buffer_bytes_per_rank


def test_custom_geometry_needs_no_top_k():
    result = capwatch("--hidden-size", "4096", "--num-experts", "96", "--ep-size", "12", "--cap", "256",
                      "--deepep-mode", "low_latency", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["buffer_bytes_per_rank"] == plan_deepep_buffer(
        custom_geometry(4096, 1, 96), 12, 256, "low_latency").buffer_bytes_per_rank
    shared = capwatch("--hidden-size", "7168", "--num-experts", "256", "--shared-experts", "1",
                      "--shared-experts-fusion", "--ep-size", "8", "--cap", "128", "--json")
    assert json.loads(shared.stdout)["buffer_experts"] == 264


def test_table_warns_past_sglangs_reserve_and_names_what_is_not_counted():
    low_latency = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "128,256", "--deepep-mode",
                           "low_latency")
    assert low_latency.returncode == 0, low_latency.stderr
    assert "1,908,410,496" in low_latency.stdout and "within" in low_latency.stdout and "over" in low_latency.stdout
    assert "warning: from cap 256" in low_latency.stdout
    assert "32.00 MiB workspace" in low_latency.stdout and "512.00 MiB steps" in low_latency.stdout
    assert "memory/rank" in low_latency.stdout
    # auto mode: normal mode's NVLink buffer counts too, so SGLang's reserve is short at the default cap already
    auto = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "128")
    assert f"{1_908_410_496 + 335_709_824:,}" in auto.stdout and "warning: from cap 128" in auto.stdout


def test_budget_finds_the_largest_aligned_cap():
    result = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--deepep-mode", "low_latency", "--budget", "4GiB",
                      "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    # 256's buffer (3.55 GiB) takes 4 GiB of NVSHMEM heap, and DeepEP's 32 MiB workspace sits beside it: only 128 fits
    assert answer["cap"] == 128 and answer["next_cap"] == 256
    assert answer["memory_bytes_per_rank"] <= 4 << 30 < answer["next_cap_memory_bytes_per_rank"]
    roomy = json.loads(capwatch("--model", "deepseek-v3", "--ep-size", "8", "--deepep-mode", "low_latency", "--budget",
                                "4128MiB", "--json").stdout)
    assert roomy["cap"] == 256 and roomy["memory_bytes_per_rank"] == (4 << 30) + (32 << 20)
    top = json.loads(capwatch("--model", "deepseek-v3", "--ep-size", "8", "--budget", "1TiB", "--json").stdout)
    assert top["cap"] == 1024 and top["next_cap"] is None  # SGLang takes no more than 1024
    table = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--budget", "4GiB").stdout
    # issue #31, symptom 6: 256 "fit" 4 GiB while its own note said the RDMA buffer takes 4 GiB of NVSHMEM heap
    # and the NVLink buffer adds 320 MiB (4,630,677,120 B)
    assert "largest 128-aligned cap whose memory/rank is within budget: 128" in table


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "gpt-oss-120b", "--ep-size", "8", "--cap", "128"],
     "DeepEP's low-latency kernels do not run hidden size 2880"),
    (["--hidden-size", "5000", "--num-experts", "64", "--ep-size", "8", "--cap", "128"], "hidden size 5000"),
    (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "2048"], "above 1024"),
    (["--model", "deepseek-v3", "--ep-size", "12", "--cap", "128", "--redundant-experts", "8"],
     "no normal-mode config for 12 ranks"),
    (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "128", "--deepep-mode", "normal"], "no token cap"),
    (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "128", "--format", "fp8"], "--format is not an option"),
    (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "128", "--mode", "sglang"], "--mode is not an option"),
    (["--model", "qwen3-235b-a22b", "--ep-size", "8", "--cap", "128", "--shared-experts-fusion"],
     "no shared experts to fuse"),
    (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "128", "--redundant-experts", "3"], "do not divide"),
    (["--model", "deepseek-v3", "--ep-size", "8", "--budget", "1GiB"], "no cap fits"),
])
def test_bad_input_is_one_clear_line_and_exit_2(args, message):
    result = capwatch(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("capwatch plan: error: "), result.stderr
    assert message in lines[0]


def test_deepep_options_are_refused_for_flashinfer():
    result = run_capwatch("plan", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "128", "--deepep-mode",
                          "low_latency", timeout_s=60)
    assert result.returncode == 2 and "--deepep-mode is not an option of the flashinfer backend" in result.stderr
    unknown = run_capwatch("plan", "--backend", "ascend_fuseep", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "128",
                           timeout_s=60)
    assert unknown.returncode == 2 and "does not size the 'ascend_fuseep' A2A backend" in unknown.stderr
