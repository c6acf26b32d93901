"""capwatch advise --sglang-log, as a user runs it: the service's advice object or one error line (exit 2)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess

import pytest
from capwatch.advisor.advice import ClusterAdvice
from capwatch.advisor.vocabulary import ACTIONS

from tests.sglang_logs.logs import T0, advise, decode_lines, read_description, traffic, write
from tests.support import launcher
from tests.support import sglang_logs as sg

LOG = sg.FORMAT["sglang-0.5.19+"]


def run_cli(*args: str, **options) -> subprocess.CompletedProcess:
    return advise(*args, **options)


def one_error_line(result: subprocess.CompletedProcess, text: str) -> None:
    assert result.returncode == 2 and text in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout and "Traceback" not in result.stderr


def test_cli_json_is_the_services_advice_object(tmp_path):
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(120, lambda m, s, d: 40 + (m % 30) + d))
    path = write(tmp_path / "server.log", lines)
    result = run_cli("--sglang-log", path, "--json")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)
    assert set(advice) == set(ClusterAdvice.model_fields)
    assert advice["cluster"] == "server" and advice["current_cap"] == 8192  # chunked 8192: SGLang's default
    assert advice["floor_cap"] == 8192 and "prefill chunk" in advice["floor_binds"]
    assert advice["kv_bytes_per_token"] == (512 + 64) * 61 * 2  # DeepSeek-V3, MLA, bf16 KV
    assert (advice["hidden_size"], advice["num_experts"], advice["top_k"]) == (7168, 256, 8)  # the model it is for
    assert advice["env"].startswith("SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK=")
    table = run_cli("--sglang-log", path, "--cap", "16384")
    assert table.returncode == 0 and "capwatch advice" in table.stdout and "lower" in table.stdout


def test_a_0_5_21_log_is_advised_by_that_releases_rules(tmp_path):
    """SGLang 0.5.19 - 0.5.21 have no start-up check and send eager prefill through an all-gather: their advice
    may go below the prefill chunk, down to the decode graph; the same traffic on 0.5.23 stays at its chunk."""
    load = decode_lines(LOG, traffic(120, lambda m, s, d: 40 + (m % 30) + d))
    old = write(tmp_path / "old.log", LOG.record(T0 - 30, [sg.args_message(sg.server_args_0_5_21())]) + load)
    new = write(tmp_path / "new.log", LOG.start(T0 - 30) + load)
    old_advice, new_advice = (json.loads(run_cli("--sglang-log", path, "--json").stdout) for path in (old, new))
    assert new_advice["floor_cap"] == 8192 and new_advice["recommended_cap"] >= 8192
    assert "max(prefill buffer 8192, 4096)" in read_description(new_advice["reasons"])
    assert old_advice["floor_cap"] == 256 and "decode CUDA-graph batch" in old_advice["floor_binds"]
    # Read without --cap: the cap in use is unknown, so the advice is the cap to set (issue #31 item 1)
    assert old_advice["action"] == "set" and not old_advice["cap_known"] and 256 <= old_advice["recommended_cap"] < 8192
    assert old_advice["current_cap"] == 8192
    assert "max(chunked prefill 8192, 4096)" in read_description(old_advice["reasons"])
    assert old_advice["max_peak_runtime_tokens"] == new_advice["max_peak_runtime_tokens"]


def test_a_log_whose_start_was_rotated_away_is_advised_from_flags(tmp_path):
    """Issue #17 item 5: decode lines only. Every flag the advice needs is named when missing; with all of them
    the advice is the same as with the start-up line (the floor, which only the args know, aside)."""
    decode_only = write(tmp_path / "decode.log", decode_lines(LOG, traffic(120, lambda m, s, d: 40 + (m % 30) + d)))
    one_error_line(run_cli("--sglang-log", decode_only),
                   "pass --cap, --model (or --hidden-size, --top-k and --num-experts), --tokens-per-request, --ep-size")
    one_error_line(run_cli("--sglang-log", decode_only, "--cap", "4096", "--model", "deepseek-v3"),
                   "pass --tokens-per-request, --ep-size")
    flags = ["--cap", "4096", "--tokens-per-request", "1", "--ep-size", "8"]
    by_model = run_cli("--sglang-log", decode_only, "--json", "--model", "deepseek-v3", *flags)
    assert by_model.returncode == 0, by_model.stderr
    by_numbers = run_cli("--sglang-log", decode_only, "--json", "--hidden-size", "7168", "--top-k", "8",
                         "--num-experts", "256", *flags)
    assert by_numbers.returncode == 0, by_numbers.stderr
    model, numbers = json.loads(by_model.stdout), json.loads(by_numbers.stdout)
    with_start = json.loads(run_cli("--sglang-log", write(tmp_path / "full.log", LOG.start(T0 - 30) + decode_lines(
        LOG, traffic(120, lambda m, s, d: 40 + (m % 30) + d))), "--json", "--cap", "4096").stdout)
    for advice in (model, numbers):
        assert advice["max_peak_runtime_tokens"] == with_start["max_peak_runtime_tokens"] == 76
        assert advice["sample_count"] == with_start["sample_count"] and advice["current_cap"] == 4096
        assert advice["floor_cap"] is None and any("start-up floor" in reason for reason in advice["reasons"])
        assert advice["workspace_bytes_per_rank_current"] == with_start["workspace_bytes_per_rank_current"]
    assert "configured by flags" in read_description(model["reasons"])
    one_error_line(run_cli("--sglang-log", decode_only, "--hidden-size", "7168", *flags),
                   "without --top-k, --num-experts")
    one_error_line(run_cli("--sglang-log", decode_only, "--model", "deepseek-v3", "--hidden-size", "7168", *flags),
                   "both describe the model")


def test_flags_override_what_the_args_say(tmp_path):
    path = write(tmp_path / "server.log", LOG.start(T0 - 30) + decode_lines(LOG, traffic(60, lambda m, s, d: 100)))
    plain = json.loads(run_cli("--sglang-log", path, "--json").stdout)
    spec = json.loads(run_cli("--sglang-log", path, "--json", "--tokens-per-request", "3", "--ep-size", "4").stdout)
    assert plain["max_peak_runtime_tokens"] == 100 and spec["max_peak_runtime_tokens"] == 300
    assert plain["ep_size"] == 8 and spec["ep_size"] == 4


@pytest.mark.parametrize("args, message", [
    ({"moe_a2a_backend": "ascend_fuseep"}, "the server runs the 'ascend_fuseep' A2A backend: capwatch does not "
                                           "size the 'ascend_fuseep'"),
    ({"moe_a2a_backend": "none"}, "moe_a2a_backend='none'"),
    ({"moe_a2a_backend": None}, "name no moe_a2a_backend"),
])
def test_a_backend_capwatch_does_not_size_gets_a_clear_message(tmp_path, args, message):
    lines = LOG.start(T0 - 30, **args) + decode_lines(LOG, traffic(30, lambda m, s, d: 100))
    path = write(tmp_path / "server.log", lines)
    one_error_line(run_cli("--sglang-log", path), message)
    if args["moe_a2a_backend"] != "deepep":  # no A2A in the log: size FlashInfer's for this traffic on request
        sized = run_cli("--sglang-log", path, "--json", "--a2a-backend", "flashinfer")
        assert sized.returncode == 0 and json.loads(sized.stdout)["env"].startswith("SGLANG_FLASHINFER_")


@pytest.mark.parametrize("content, message", [
    ("hello\nworld\n", "no SGLang decode lines"),
    (sg.line(T0, "server_args={'tp_size': 8, 'model_path': 'x'}") + "\n" + sg.line(T0, "Prefill batch, #new-seq: 1")
     + "\n", "no SGLang decode lines ('Decode batch, #running-req: ...') after the server_args= line"),
    (sg.line(T0, "server_args={'tp_size': 8, 'model_path': ") + "\n" + sg.line(T0 + 1, sg.decode_message(3)) + "\n",
     "the server_args line does not read: not Python syntax"),
    (LOG.start(T0 - 30, model_path="/models/my-own-moe")[0] + "\n" + "\n".join(
        decode_lines(LOG, traffic(3, lambda m, s, d: 1))) + "\n", "pass --model NAME"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "bad.log"
    path.write_text(content)
    one_error_line(run_cli("--sglang-log", str(path)), message)
    missing = run_cli("--sglang-log", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "is not a readable file" in missing.stderr


def test_server_flags_without_sglang_log_are_refused(tmp_path):
    one_error_line(run_cli("--tokens-per-request", "2", "--cap", "256"),
                   "--cap, --tokens-per-request go(es) with --sglang-log")


def test_a_truncated_gzip_log_is_one_line_and_exit_2(tmp_path):
    """A rotated log copied while it was still being written ends mid-stream: EOFError, not OSError."""
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(120, lambda m, s, d: 40 + (m % 30) + d))
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    path = tmp_path / "server.log.1.gz"
    path.write_bytes(whole[: len(whole) // 2])
    one_error_line(run_cli("--sglang-log", str(path)), "cannot read the log")


def test_cli_whatif_prices_caps_with_predicted_overflows_per_day(tmp_path):
    lines = LOG.start(T0 - 30, disaggregation_mode="decode") + decode_lines(
        LOG, traffic(180, lambda m, s, d: 200 + (m % 40) * 5 + d))
    path = write(tmp_path / "decode.log", lines)
    result = run_cli("--sglang-log", path, "--whatif", "128", "256", "512", "1024", "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]  # JSON Lines: a row each
    assert [row["cap"] for row in rows] == [128, 256, 512, 1024]
    per_day = [row["predicted_overflow_windows_per_day"] for row in rows]
    assert per_day[0] == pytest.approx(1440.0) and per_day == sorted(per_day, reverse=True)  # 128: every window
    assert rows[0]["below_floor"] and not rows[1]["below_floor"]  # PD decode: floor = decode graph 256 x 1
    assert all(row["predicted_overflow_windows_per_day_low"] <= row["predicted_overflow_windows_per_day"]
               <= row["predicted_overflow_windows_per_day_high"] for row in rows)


def test_a_large_log_shows_a_progress_bar_on_a_terminal_and_none_in_a_pipe(tmp_path):
    import pty

    from capwatch.commands.advise import PROGRESS_MIN_BYTES

    block = "\n".join(decode_lines(LOG, traffic(10, lambda m, s, d: 30 + d))) + "\n"
    path = tmp_path / "big.log"
    with open(path, "w") as handle:
        handle.write(LOG.start(T0 - 30)[0] + "\n")
        # the same ten minutes again and again (a log concatenated with itself: placed, the peak unchanged);
        # what is tested is the bar
        for _ in range(PROGRESS_MIN_BYTES // len(block) + 2):
            handle.write(block)
    leader, follower = pty.openpty()
    try:
        result = advise("--sglang-log", str(path), "--json", stderr=follower)
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


def test_the_services_advisor_settings_shape_advice_from_logs(tmp_path):
    """The same CAPWATCH_* knobs as `capwatch serve`: a wider window gives fewer windows; a bad one is one line."""
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(120, lambda m, s, d: 40 + (m % 30) + d))
    path = write(tmp_path / "server.log", lines)
    default = run_cli("--sglang-log", path, "--json")
    wide = run_cli("--sglang-log", path, "--json", env={"CAPWATCH_WINDOW_S": "600"})
    assert default.returncode == wide.returncode == 0, default.stderr + wide.stderr
    assert json.loads(wide.stdout)["sample_count"] < json.loads(default.stdout)["sample_count"]
    one_error_line(run_cli("--sglang-log", path, env={"CAPWATCH_WINDOW_S": "-1"}), "window_s")
    strict = run_cli("--sglang-log", path, "--json", env={"CAPWATCH_ADVISOR__MIN_SAMPLES": "100000"})
    assert strict.returncode == 0 and json.loads(strict.stdout)["action"] == "insufficient_data", strict.stderr
    one_error_line(run_cli("--sglang-log", path, env={"CAPWATCH_ADVISOR__SAFETY_MARGIN": "-1"}), "safety_margin")
    # The service's own settings are not the log reader's: one it would refuse at start changes nothing here.
    served = run_cli("--sglang-log", path, "--json", env={"CAPWATCH_PORT": "-1", "CAPWATCH_TOKEN": " "})
    assert served.returncode == 0 and json.loads(served.stdout) == json.loads(default.stdout), served.stderr


def test_advice_from_logs_loads_nothing_of_the_service(tmp_path):
    """The log reader runs the advisor, a library below the service: advising from a log in a fresh process
    imports no capwatch.service module (and no FastAPI)."""
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(30, lambda m, s, d: 40 + (m % 30) + d))
    path = write(tmp_path / "server.log", lines)
    probe = ("import sys; from capwatch.sglang_logs.advise import advise_from_sglang_logs; "
             f"print(advise_from_sglang_logs([{path!r}]).advice.action); "
             "print(sorted(name for name in sys.modules if name.startswith(('capwatch.service', 'fastapi'))))")
    result = launcher.run("-c", probe, timeout_s=120)
    assert result.returncode == 0, result.stderr
    action, loaded = result.stdout.strip().splitlines()
    assert action in ACTIONS and loaded == "[]", result.stdout


@pytest.mark.parametrize("mode, binds, floor", [
    ("low_latency", "prefill chunk", 512),  # prefill batches go through the low-latency buffer: the chunk binds
    ("auto", "decode CUDA-graph batch 160", 160),  # auto sends prefill to normal mode (no cap): the decode graph
])
def test_a_deepep_server_is_advised_deepeps_variable_within_its_rules(tmp_path, mode, binds, floor):
    """A DeepEP server's log (issue #19): its default cap (128), its variable, DeepEP's buffer as SGLang sizes it
    (the mode, redundant experts), multiples of 128 up to 1024, and the floor term its mode lets through."""
    from capwatch.backends.deepep import RULES as DEEPEP
    from capwatch.sglang_engine.deepep import plan_deepep_buffer
    from capwatch.sizing.model_presets import model_geometry

    lines = LOG.start(T0 - 30, moe_a2a_backend="deepep", deepep_mode=mode, ep_num_redundant_experts=32,
                      chunked_prefill_size=512, decode_max_bs=160) + decode_lines(
        LOG, traffic(120, lambda m, s, d: 60 + (m % 30) + d))
    result = run_cli("--sglang-log", write(tmp_path / "deepep.log", lines), "--json")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)
    assert (advice["a2a_backend"], advice["cap_variable"], advice["current_cap"]) == ("deepep", DEEPEP.cap_env_var, 128)
    assert advice["floor_cap"] == floor and binds in advice["floor_binds"], advice
    assert advice["recommended_cap"] % 128 == 0 and floor <= advice["recommended_cap"] <= 1024
    assert advice["env"] == f"{DEEPEP.cap_env_var}={advice['recommended_cap']}"
    assert any("DeepEP's dispatch assertion" in reason for reason in advice["reasons"]), advice["reasons"]
    planned = plan_deepep_buffer(model_geometry("deepseek-v3"), 8, advice["recommended_cap"], mode, 32)
    assert advice["workspace_bytes_per_rank_recommended"] == planned.buffer_bytes_per_rank
    # DeepSeek-V3's buffer outgrows the flat 2048 MB SGLang reserves for DeepEP above 128 tokens: said, and by how much.
    assert advice["over_sglang_reserve_bytes_recommended"] == planned.over_sglang_reserve_bytes > 0
    assert any("SGLang's automatic --mem-fraction-static reserves" in reason for reason in advice["reasons"])


def test_a_deepep_normal_mode_server_has_no_cap_to_advise(tmp_path):
    lines = LOG.start(T0 - 30, moe_a2a_backend="deepep", deepep_mode="normal") + decode_lines(
        LOG, traffic(30, lambda m, s, d: 60 + d))
    one_error_line(run_cli("--sglang-log", write(tmp_path / "normal.log", lines)),
                   "--deepep-mode normal: it has no low-latency buffer and no per-rank token cap")
