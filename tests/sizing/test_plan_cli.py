"""``capwatch plan`` run as a real process, the way a user runs it."""

from __future__ import annotations

import json
import subprocess

import pytest
from capwatch.sizing.model_presets import model_geometry
from capwatch.sglang_engine.flashinfer import plan_workspace

from tests.support.launcher import run_capwatch


def capwatch(*args: str) -> subprocess.CompletedProcess:
    return run_capwatch("plan", *args, env={"COLUMNS": "200"}, timeout_s=60)


def test_done_when_command_gives_the_worked_value():
    result = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--format", "bf16", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["workspace_bytes_per_rank"] == 235_585_920
    assert plan["aux_bytes"] == 180_608
    assert (plan["dispatch_bytes_per_token"], plan["combine_bytes_per_token"]) == (14_400, 14_336)
    assert plan["workspace_bytes_group"] == 8 * 235_585_920 and plan["expert_rows"] == 8192
    assert (plan["model"], plan["ep_size"], plan["cap"], plan["payload_format"]) == ("deepseek-v3", 8, 1024, "bf16")


def test_several_caps_give_a_list_in_order_from_lists_ranges_and_repeats():
    result = capwatch("--model", "Kimi-K2", "--ep-size", "16", "--cap", "512:1024:256", "--cap", "4096,2048",
                      "--format", "nvfp4", "--json")
    assert result.returncode == 0, result.stderr
    plans = [json.loads(line) for line in result.stdout.splitlines()]  # JSON Lines: a plan each
    assert [p["cap"] for p in plans] == [512, 768, 1024, 4096, 2048]
    kimi = model_geometry("kimi-k2")
    assert [p["workspace_bytes_per_rank"] for p in plans] == [  # what SGLang allocates, by default
        plan_workspace(kimi, 16, cap, "nvfp4", mode="sglang").workspace_bytes_per_rank
        for cap in (512, 768, 1024, 4096, 2048)]


def test_custom_geometry_sglang_legacy_and_draft():
    legacy = json.loads(capwatch("--hidden-size", "4096", "--top-k", "8", "--num-experts", "128", "--ep-size", "4",
                                 "--cap", "1024", "--mode", "sglang-legacy", "--json").stdout)
    assert legacy["max_num_tokens"] == 4096 and legacy["model"] == "custom"
    target = json.loads(capwatch("--model", "qwen3-235b-a22b", "--ep-size", "4", "--cap", "1024", "--mode", "sglang",
                                 "--json").stdout)
    draft = json.loads(capwatch("--model", "qwen3-235b-a22b", "--ep-size", "4", "--cap", "1024", "--mode", "sglang",
                                "--draft", "--json").stdout)
    assert draft["workspace_bytes_per_rank"] - target["workspace_bytes_per_rank"] == 128
    assert legacy["workspace_bytes_per_rank"] > 3 * target["workspace_bytes_per_rank"]


def test_table_shows_human_and_exact_sizes():
    result = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024,16384")
    assert result.returncode == 0, result.stderr
    assert "224.67 MiB" in result.stdout and "235,585,920" in result.stdout
    assert "3.51 GiB" in result.stdout and "3,769,368,960" in result.stdout
    assert "flashinfer 0.7.2.post1" in result.stdout


def test_budget_json_and_table():
    result = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--budget", "2GiB", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["cap"] == 9216 and answer["budget_bytes"] == 2 << 30
    assert answer["workspace_bytes_per_rank"] <= 2 << 30 < answer["next_cap_workspace_bytes_per_rank"]
    assert answer["next_cap"] == 9344
    table = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--budget", "2048 MiB")
    assert "largest 128-aligned cap within budget: 9216" in table.stdout


def test_help_documents_cap_and_budget_syntax():
    result = capwatch("--help")
    assert result.returncode == 0
    assert "START:STOP[:STEP]" in result.stdout and "2GiB" in result.stdout and "sglang-legacy" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "deepseek-v3", "--ep-size", "0", "--cap", "1024"], "ep-size must be positive"),
        (["--model", "deepseek-v3", "--ep-size", "-8", "--cap", "1024"], "ep-size must be positive"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "0"], "--cap must be positive"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "-1024"], "must be"),
        (["--hidden-size", "0", "--top-k", "8", "--num-experts", "64", "--ep-size", "8", "--cap", "1"],
         "hidden-size must be positive"),
        (["--hidden-size", "4096", "--top-k", "23", "--num-experts", "64", "--ep-size", "8", "--cap", "1"],
         "top_k 23 exceeds"),
        (["--model", "deepseek-v3", "--ep-size", "65", "--cap", "1024"], "limit of 64 ranks"),
        (["--hidden-size", "4096", "--top-k", "2", "--num-experts", "4", "--ep-size", "8", "--cap", "1"],
         "num_experts 4 must be >= ep_size 8"),
        (["--hidden-size", "4096", "--top-k", "2", "--ep-size", "8", "--cap", "1"], "needs --num-experts"),
        (["--model", "deepseek-v3", "--top-k", "2", "--ep-size", "8", "--cap", "1"], "either --model"),
        (["--ep-size", "8", "--cap", "1"], "give --model"),
        (["--model", "gpt-5", "--ep-size", "8", "--cap", "1024"], "unknown model 'gpt-5'; known: deepseek-r1"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--format", "int4"], "unknown payload format"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--flashinfer-version", "0.5.3"],
         "no MoE A2A"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--flashinfer-version", "latest"],
         "not of the form"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--budget", "two gigs"], "cannot read 'two gigs' as a size"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--budget=-2GiB"], "cannot read"),
        (["--model", "deepseek-v3", "--cap", "1024"], "give --ep-size"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--budget", "1KiB"], "no cap fits"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "4096:1024"], "runs backwards"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1:2:3:4"], "START:STOP"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024:2048:0"], "step must be positive"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1:100000:1"], "more than 4096 caps"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024,,2048"], "empty entry"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1k"], "--cap must be an integer"),
        (["--model", "deepseek-v3", "--ep-size", "8"], "give --cap"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--budget", "2GiB"], "exactly one"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--mode", "vllm"], "unknown --mode"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--mode", "flashinfer", "--draft"],
         "--mode sglang"),
        (["--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--eplb-stats-experts", "-1"], "must be >= 0"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args, message):
    result = capwatch(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("capwatch plan: error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_0_7_4_says_which_regions_it_could_not_size_offline():
    fence = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--flashinfer-version", "0.7.4")
    assert fence.returncode == 0, fence.stderr
    said = " ".join(fence.stdout.split())  # the note wraps at the terminal's width
    assert "not sized offline" in said and "CFT's combine receive inbox" in said and "Lamport transport's regions" in said
    both = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--flashinfer-version", "0.7.4",
                    "--cft", "--lamport-tokens", "159", "--json")
    assert both.returncode == 0, both.stderr
    plan = json.loads(both.stdout)
    assert plan["cft"] is True and plan["lamport_bytes"] > 0
    assert plan["workspace_bytes_per_rank"] == plan_workspace(
        model_geometry("deepseek-v3"), 8, 1024, flashinfer_version="0.7.4", cft=True,
        lamport_max_tokens=159).workspace_bytes_per_rank > 235_472_384  # the fence path's figure
    only_cft = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--flashinfer-version", "0.7.4",
                        "--cft")
    said = " ".join(only_cft.stdout.split())
    assert "not sized offline" in said and "CFT's" not in said and "Lamport transport's regions" in said
    refused = capwatch("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024", "--cft")
    assert refused.returncode != 0 and "only in flashinfer 0.7.4" in refused.stderr
