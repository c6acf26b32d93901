"""A pplx server's log (``--moe-a2a-backend pplx``): its start-up args, its decode lines and SGLang's own overflow
assertion (``token_dispatcher/pplx.py`` ``dispatch_a``: ``num_tokens (N) exceeds num_max_dispatch_tokens_per_rank
(C); raise SGLANG_PPLX_...``) give advice on pplx's own variable, priced in pplx-kernels' AllToAll bytes."""

from __future__ import annotations

import json

import pytest
from capwatch.backends import spec_of
from capwatch.backends.pplx import PplxAllToAll, config_of
from capwatch.sglang_logs.line_shapes import NOT_OVERFLOW, Overflow, parse_overflow
from capwatch.sizing.model_presets import model_geometry
from capwatch.sizing.pplx import pplx_plan

from tests.sglang_logs.logs import T0, decode_lines, rank, traffic, write
from tests.support.sglang_logs import args_message, server_args, server_args_0_5_21
from tests.sglang_logs.test_cli import LOG, run_cli

PPLX = spec_of("pplx").rules


def pplx_overflow_traceback(num_tokens: int, cap: int) -> list[str]:
    """What run_scheduler_process logs when 0.5.23's ``_PplxDispatcherImpl.dispatch_a`` assertion fails."""
    return [
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 6372, in run_scheduler_process',
        "    scheduler.run_event_loop()",
        '  File "/sgl/python/sglang/srt/layers/moe/token_dispatcher/pplx.py", line 291, in dispatch_a',
        "    assert num_tokens <= self.num_max_dispatch_tokens_per_rank, (",
        '        f"num_tokens ({num_tokens}) exceeds num_max_dispatch_tokens_per_rank "',
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        f"AssertionError: num_tokens ({num_tokens}) exceeds num_max_dispatch_tokens_per_rank ({cap}); raise "
        f"{PPLX.cap_env_var} or lower the per-rank decode batch / chunked-prefill size.",
        "",
    ]


def test_the_assertion_reads_as_the_batch_against_the_cap_and_its_source_lines_do_not():
    lines = pplx_overflow_traceback(300, 128)
    assert parse_overflow(lines[-2]) == Overflow(300, 128)
    assert parse_overflow(lines[5]) == NOT_OVERFLOW  # the traceback's source line names the words, no assertion
    assert "does not read" in parse_overflow("AssertionError: num_tokens exceeds num_max_dispatch_tokens_per_rank")


def test_a_pplx_servers_log_is_advised_pplxs_own_variable_above_its_overflow(tmp_path):
    lines = LOG.start(T0 - 30, moe_a2a_backend="pplx", moe_runner_backend="deep_gemm", chunked_prefill_size=128,
                      decode_max_bs=64) + decode_lines(LOG, traffic(60, lambda m, s, d: 20 + (m % 10) + d))
    lines += LOG.record(T0 + 30 * 60 + 5, pplx_overflow_traceback(300, 128), rank(3))
    result = run_cli("--sglang-log", write(tmp_path / "pplx.log", lines), "--json")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == ("pplx", PPLX.cap_env_var, 128)
    assert advice["recommended_cap"] >= 300 and advice["recommended_cap"] % PPLX.alignment == 0, advice
    assert advice["env"] == f"{PPLX.cap_env_var}={advice['recommended_cap']}"
    assert any("1 overflow assertion" in reason for reason in advice["reasons"]), advice["reasons"]
    # DeepSeek-V3 on 8 ranks, one per DP group, one node: pplx-kernels' intranode AllToAll at the advised cap
    v3 = model_geometry("deepseek-v3")
    config = config_of(8, v3.hidden_size, v3.num_experts, PplxAllToAll(transport="intranode", dp_size=1))
    assert advice["workspace_bytes_per_rank_recommended"] == pplx_plan(config, advice["recommended_cap"]).all_to_all_bytes


def test_an_internode_pplx_servers_log_says_why_it_cannot_be_priced(tmp_path):
    lines = LOG.start(T0 - 30, moe_a2a_backend="pplx", moe_runner_backend="deep_gemm", nnodes=2) + decode_lines(
        LOG, traffic(30, lambda m, s, d: 20 + d))
    result = run_cli("--sglang-log", write(tmp_path / "pplx-internode.log", lines))
    assert result.returncode != 0
    assert "depend on the dispatch dtype" in result.stderr, result.stderr


@pytest.mark.parametrize("release_args", ["0.5.23", "0.5.21"])
def test_the_floor_is_sglangs_own_start_check_the_chunk_or_the_decode_graph_batch(tmp_path, release_args):
    """SGLang refuses to start a pplx server with chunked prefill (not a decode server) whose cap is below the chunk
    or the decode CUDA-graph batch as set, the larger (``required_pplx_dispatch_tokens_per_rank``, every verified
    release): the floor the advice keeps, 64 here, where the decode graph's resolved bucket (what SGLang logs in
    ``cuda_graph_config``, 32) would say less. tests/sglang/test_logs.py checks the same against each release's own
    start-up line and SGLang's own function; this is the command a user runs."""
    start = {"moe_a2a_backend": "pplx", "moe_runner_backend": "deep_gemm", "chunked_prefill_size": 16,
             "decode_max_bs": 32, "cuda_graph_max_bs_decode": 64, "max_running_requests": 40}
    args = server_args(**start) if release_args == "0.5.23" else server_args_0_5_21(**start)
    lines = LOG.record(T0 - 30, [args_message(args)]) + decode_lines(LOG, traffic(60, lambda m, s, d: 2 + d % 3))
    result = run_cli("--sglang-log", write(tmp_path / "pplx.log", lines), "--json")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)
    assert advice["floor_cap"] == 64, advice
    assert advice["recommended_cap"] is None or advice["recommended_cap"] >= 64, advice
