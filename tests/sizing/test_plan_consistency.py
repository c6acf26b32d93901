"""``capwatch plan`` consistent with itself and with SGLang (issue #31, symptom 6), run as a user runs it."""

from __future__ import annotations

import json
import subprocess

from capwatch.sizing.deepep_plan import DEEPEP_WORKSPACE_BYTES, NVSHMEM_HEAP_STEP_BYTES
from capwatch.sizing.model_presets import model_geometry
from capwatch.sglang_engine.flashinfer import plan_workspace

from tests.support.launcher import run_capwatch


def plan(*args: str) -> subprocess.CompletedProcess:
    return run_capwatch("plan", *args, env={"COLUMNS": "200"}, timeout_s=60)


def lines(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_deepep_budget_answer_holds_every_buffer_its_note_names():
    """`--budget 4GiB` answered cap 256 "fits" though NVSHMEM maps the RDMA buffer in 512 MiB steps (4 GiB at 256)
    and the NVLink buffer adds 320 MiB: 4,630,677,120 B against 4,294,967,296."""
    [answer] = lines(plan("--backend", "deepep", "--model", "deepseek-v3", "--ep-size", "8", "--budget", "4GiB",
                          "--json"))
    taken = -(-answer["num_rdma_bytes"] // NVSHMEM_HEAP_STEP_BYTES) * NVSHMEM_HEAP_STEP_BYTES \
        + answer["num_nvl_bytes"] + DEEPEP_WORKSPACE_BYTES
    assert answer["memory_bytes_per_rank"] == taken <= 4 << 30
    assert answer["cap"] == 128 and answer["next_cap_memory_bytes_per_rank"] > 4 << 30
    [at_256] = lines(plan("--backend", "deepep", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "256", "--json"))
    assert at_256["nvshmem_heap_bytes_at_least"] + at_256["num_nvl_bytes"] == 4_630_677_120  # the figure


def test_a_deepep_cap_off_128_is_flagged_as_advise_flags_it():
    """`--cap 100` was priced silently while `advise` warns that it corrupts DeepEP's FP8 scales (sglang#28994)."""
    table = plan("--backend", "deepep", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "100,128")
    assert table.returncode == 0, table.stderr
    assert "warning: cap 100 is not a multiple of 128" in table.stdout and "sglang#28994" in table.stdout
    assert "cap 128" not in table.stdout.split("warning: cap", 1)[1].split("\n", 1)[0]
    as_json = plan("--backend", "deepep", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "100,128", "--json")
    assert [(row["cap"], row["aligned"]) for row in lines(as_json)] == [(100, False), (128, True)]
    assert "sglang#28994" in as_json.stderr  # the warning, off the JSON
    flashinfer = plan("--model", "deepseek-v3", "--ep-size", "8", "--cap", "100")  # any cap works there
    assert flashinfer.returncode == 0 and "warning" not in flashinfer.stdout


def test_nvfp4_is_priced_as_sglang_allocates_it_by_default():
    """`plan --format nvfp4` answered FlashInfer's nvfp4 figure (604,701,056 B at 4096) where SGLang allocates the
    bf16 one (942,342,528 B): an SGLang user under-budgeted by 36 %."""
    [default] = lines(plan("--model", "deepseek-v3", "--ep-size", "8", "--cap", "4096", "--format", "nvfp4", "--json"))
    assert default["mode"] == "sglang" and default["workspace_bytes_per_rank"] == 942_342_528
    assert default["workspace_bytes_per_rank"] == plan_workspace(model_geometry("deepseek-v3"), 8, 4096, "bf16",
                                                                 mode="sglang").workspace_bytes_per_rank
    [flashinfer] = lines(plan("--model", "deepseek-v3", "--ep-size", "8", "--cap", "4096", "--payload-format", "nvfp4",
                              "--mode", "flashinfer", "--json"))
    assert flashinfer["workspace_bytes_per_rank"] == 604_701_056
    table = plan("--model", "deepseek-v3", "--ep-size", "8", "--cap", "4096", "--format", "nvfp4")
    assert "mode sglang" in table.stdout  # the mode is named on the table


def test_output_formats():
    caps = ("--model", "deepseek-v3", "--ep-size", "8", "--cap", "1024,2048")
    as_json, alias = lines(plan(*caps, "--format", "json")), lines(plan(*caps, "--json"))
    assert as_json == alias and [row["cap"] for row in as_json] == [1024, 2048]
    as_csv = plan(*caps, "--format", "csv")
    header, *rows = as_csv.stdout.splitlines()
    assert header.startswith("model,") and len(rows) == 2 and ",1024," in rows[0]
