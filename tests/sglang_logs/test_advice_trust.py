"""Advice from a log that a person can act on without checking it (issue #31 items 1-3): never an action or a price
relative to a cap the log does not show, a low-confidence state said first, the real reason of every hold, the hot DP
rank named. Each test reproduces a symptom of the issue on the code before it (e0cc95d)."""

from __future__ import annotations

import json

from capwatch.sglang_logs.advise import ServerFlags, advise_from_sglang_logs
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.flashinfer import RULES as FLASHINFER

from tests.sglang_logs.logs import T0, advise, decode_lines, traffic, write
from tests.support import sglang_logs as sg

LOG = sg.FORMAT["sglang-0.5.19+"]
# The words of an action or a price relative to the cap in use.
RELATIVE = ("raising", "lowering", "frees", "costs", "above the current cap", "below the current cap")


def deepep_decode_log(tmp_path, minutes: int = 180) -> str:
    """A DeepEP decode server whose real cap (1024, set in the environment) the log does not show: its DP rank 7
    peaks at 294 tokens, far above SGLang's default 128, with no overflow assertion."""
    lines = LOG.start(T0 - 30, moe_a2a_backend="deepep", deepep_mode="low_latency", chunked_prefill_size=128,
                      decode_max_bs=128, disaggregation_mode="decode") + decode_lines(
        LOG, traffic(minutes, lambda m, s, d: 200 + (m % 30) * 3 + d))
    return write(tmp_path / "deepep.log", lines)


def test_a_deepep_log_read_without_cap_is_sized_never_raised_from_the_default(tmp_path):
    """Symptom 1: read without --cap, the log got "raise 128 -> 512" with every window "overflowed" (0 assertions)
    though DeepEP asserts on any batch above its cap. Now: the cap is unknown, at least the 294 tokens that ran
    without an assertion; the advice is the cap to set and its bounds, marked so nothing applies it."""
    path = deepep_decode_log(tmp_path)
    advice = advise_from_sglang_logs([path]).advice
    assert advice.overflow_windows == 0 and advice.action == "set", (advice.action, advice.overflow_windows)
    assert (advice.cap_known, advice.cap_source, advice.cap_at_least) == (False, "assumed", 294)
    # A log does not show the environment: who set the cap (capwatch, the operator, SGLang's default) is not said.
    assert (advice.cap_set_by, advice.cap_advice_revision, advice.cap_origin) == (None, None, None)
    assert advice.recommended_cap == advice.target_cap == 384 and advice.env == f"{DEEPEP.cap_env_var}=384"
    assert advice.lower_bound <= 384 <= advice.upper_bound
    # Nothing priced or predicted against the assumed 128.
    assert advice.workspace_bytes_group_delta is None and advice.kv_cache_tokens_per_rank_freed is None
    assert advice.predicted_overflow_rate_current is None and advice.workspace_bytes_per_rank_current is None
    assert advice.workspace_bytes_per_rank_recommended > 0
    text = " ".join(advice.reasons)
    assert not any(word in text for word in RELATIVE), advice.reasons
    unknown = next(reason for reason in advice.reasons if "is unknown" in reason)
    assert "at least 294" in unknown and "128" in unknown and "assumed" in unknown, unknown
    # Given the cap, the same log says what to do about it.
    known = advise_from_sglang_logs([path], ServerFlags(cap=1024)).advice
    assert (known.cap_known, known.cap_source, known.cap_at_least) == (True, "flag", 294)
    assert known.cap_origin is None  # --cap says the value, not who set it
    assert known.action in ("hold", "lower") and known.current_cap == 1024


def test_a_flashinfer_log_read_without_cap_is_not_lowered_from_the_default(tmp_path):
    """Symptom 1: a FlashInfer server at 1024 read without --cap got "current 4096 -> lower 1024, frees 0.66 GiB
    per rank" (here SGLang's default 8192, the prefill chunk): no action, no price against it."""
    lines = LOG.start(T0 - 30, chunked_prefill_size=512, decode_max_bs=256) + decode_lines(
        LOG, traffic(24 * 60, lambda m, s, d: 150 + (m * 7 + d * 13) % 60))
    advice = advise_from_sglang_logs([write(tmp_path / "server.log", lines)]).advice
    assert advice.action == "set" and not advice.cap_known and advice.current_cap == 4096
    assert advice.recommended_cap < 4096 and advice.env == f"{FLASHINFER.cap_env_var}={advice.recommended_cap}"
    assert not any(word in " ".join(advice.reasons) for word in RELATIVE), advice.reasons
    assert advice.workspace_bytes_group_delta is None


def test_an_overflow_assertion_makes_the_cap_known(tmp_path):
    """The assertion's max_num_tokens is the cap that was in use: advice relative to it is sound."""
    load = decode_lines(LOG, traffic(60, lambda m, s, d: 300 + d))
    crash = LOG.record(T0 + 30 * 60 + 5, sg.overflow_traceback(900, 512))
    advice = advise_from_sglang_logs([write(tmp_path / "server.log", LOG.start(T0 - 30) + load + crash)]).advice
    assert advice.action == "raise" and advice.overflow_windows == 1 and advice.current_cap == 512
    assert (advice.cap_known, advice.cap_source) == (True, "assertion")


def test_the_table_marks_the_assumed_cap_and_the_action_on_it(tmp_path):
    result = advise("--sglang-log", deepep_decode_log(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "unknown (assumed 128)" in result.stdout and "set (cap unknown" in result.stdout, result.stdout
    as_json = json.loads(advise("--sglang-log", deepep_decode_log(tmp_path), "--json").stdout)
    assert as_json["cap_known"] is False and as_json["action"] == "set"


def test_two_hours_of_log_do_not_cut_the_cap_sixteen_fold(tmp_path):
    """Symptom 2: two hours of log gave "lower 8192 -> 512" at confidence 0.08 with "0 (<= 36.3)" overflowing
    windows a day against a target of 0.033. A lower whose band misses the target is not advised; low confidence
    is said first; the band is labelled."""
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(120, lambda m, s, d: 150 + (m * 7 + d * 13) % 60))
    path = write(tmp_path / "server.log", lines)
    advice = advise_from_sglang_logs([path], ServerFlags(cap=16384)).advice
    assert advice.action == "hold" and advice.recommended_cap == 16384, advice.reasons
    assert advice.low_confidence and advice.confidence < 0.1
    assert advice.reasons[0].startswith("low confidence"), advice.reasons
    assert "2.0 h" in advice.reasons[0] and "12.0 h" in advice.reasons[0]
    band = next(reason for reason in advice.reasons if "not lowering" in reason)
    assert "band up to" in band and "target" in band, band
    table = advise("--sglang-log", path, "--cap", "16384")
    assert table.returncode == 0, table.stderr
    assert "hold (low confidence)" in table.stdout and "band up to" in table.stdout, table.stdout


def test_the_memory_fraction_to_set_is_given_not_only_the_bytes(tmp_path):
    """Symptom 8: "lower --mem-fraction-static by 3.64 GiB" without the value to set. The args say 0.82: the value
    is 0.82 less the bytes over SGLang's reserve per GiB of the GPU's memory, worked out for two GPUs."""
    advice = advise_from_sglang_logs([deepep_decode_log(tmp_path)]).advice
    over_gib = advice.over_sglang_reserve_bytes_recommended / 2**30
    assert advice.mem_fraction_static == 0.82 and over_gib > 0
    memory = next(reason for reason in advice.reasons if "--mem-fraction-static" in reason)
    assert "lower --mem-fraction-static by" not in memory, memory
    assert f"set --mem-fraction-static to 0.82 - {over_gib:.2f} / G" in memory, memory
    assert f"{0.82 - over_gib / 80:.3f} where G = 80" in memory and f"{0.82 - over_gib / 141:.3f} where G = 141" in memory


def test_the_dp_rank_that_leads_every_window_is_named(tmp_path):
    """Symptom 4: a DP rank at 556 tokens with the others at 205 - 218 was not named (the reader named one only
    when more than one rank had held a window's peak)."""
    lines = LOG.start(T0 - 30) + decode_lines(
        LOG, traffic(60, lambda m, s, d: 556 if d == 5 else 205 + (m + d) % 14))
    advice = advise_from_sglang_logs([write(tmp_path / "server.log", lines)], ServerFlags(cap=8192)).advice
    hot = next(reason for reason in advice.reasons if "drives the group's peak" in reason)
    assert hot.startswith("DP rank 5 ") and "556" in hot and "60 of 60 windows" in hot, hot


def test_the_advice_words_say_what_they_count(tmp_path):
    """Symptom 8's advice wording: no "(0.0 h covered)", no "3 / windows seen above the largest sample"."""
    lines = LOG.start(T0 - 30) + decode_lines(LOG, traffic(25, lambda m, s, d: 150 + d))
    advice = advise_from_sglang_logs([write(tmp_path / "server.log", lines)], ServerFlags(cap=8192)).advice
    text = " ".join(advice.reasons)
    assert "0.0 h" not in text and "(25 min covered)" in text, advice.reasons
    assert "3 / windows" not in text and "rule of three" in text, advice.reasons
