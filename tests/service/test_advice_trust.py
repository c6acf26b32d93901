"""Advice from reports a person can act on without checking it (issue #31 items 2 and 3): every hold says the test
that failed, with its figures and what would change the answer; a low-confidence state said first; the same evidence
gives the same answer from reports as from a log."""

from __future__ import annotations

import json

import pytest
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.recommend import recommend
from capwatch.sglang_logs.advise import ServerFlags, advise_from_sglang_logs

from tests.service.conftest import JSON
from tests.service.test_advisor import group, history_from
from tests.sglang_logs.logs import T0, decode_lines, traffic, write
from tests.support import sglang_logs as sg
from tests.support.simulate import SimulatedRank

LOG = sg.FORMAT["sglang-0.5.19+"]


def test_a_hold_on_short_history_says_so_not_that_the_change_is_small():
    """Symptom 3: three hours of history, an 84 % change: the hold read "a 84% change is not worth a restart"; the
    real reason is 3.0 h of history against the 12 h CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S asks for."""
    advice = recommend(history_from([[140 + window % 20 for window in range(180)]], cap=1024), group(1024),
                       AdvisorPolicy())
    assert advice.action == "hold" and advice.lower_bound <= 1024 <= advice.upper_bound
    why = next(reason for reason in advice.reasons if reason.startswith("holding 1024"))
    assert "not worth a restart" not in why, why
    assert "3.0 h of covered history is less than the 12.0 h" in why and "CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S" in why
    assert f"change to {advice.target_cap} is advised once 9.0 h more is covered" in why, why


def test_a_hold_on_a_small_change_names_the_ratio_and_what_would_move_it():
    policy = AdvisorPolicy(change_min_history_s=3600.0, full_confidence_history_s=3600.0)
    advice = recommend(history_from([[880 + window % 10 for window in range(120)]], cap=1100), group(1100), policy)
    change = abs(advice.target_cap - 1100) / 1100
    assert advice.action == "hold" and 0 < change < 0.10, advice.reasons
    why = next(reason for reason in advice.reasons if reason.startswith("holding 1100"))
    assert f"a {change:.0%} change to {advice.target_cap} is less than the 10%" in why, why
    assert "CAPWATCH_ADVISOR__CHANGE_MIN_RATIO" in why
    assert "only a sized cap of at most 990 or at least 1210 would be" in why, why
    assert "covered history is less" not in why


def test_low_confidence_is_said_first_and_flagged():
    advice = recommend(history_from([[140 + window % 20 for window in range(120)]], cap=8192), group(8192),
                       AdvisorPolicy())
    assert advice.action == "hold", advice.reasons  # no lower on a band 1,000x the target
    assert advice.low_confidence and advice.reasons[0].startswith("low confidence: 2.0 h of covered history")
    full = recommend(history_from([[140 + window % 20 for window in range(120)]], cap=8192), group(8192),
                     AdvisorPolicy(full_confidence_history_s=3600.0))
    assert not full.low_confidence and not full.reasons[0].startswith("low confidence")


def post_windows(client, clock, peaks: list[int], cap: int) -> None:
    """One rank of an 8-rank group reports each window's group peak (FlashInfer's R is group-wide)."""
    rank = SimulatedRank("fromreports", 0, 8, cap=cap)
    for window, peak in enumerate(peaks):
        clock.now = T0 + 60 * window + 60  # as a live rank sends it, at the end of its interval
        body = rank.report(T0 + 60 * window, T0 + 60 * window + 59, [peak])
        assert client.post("/v1/reports", content=json.dumps(body), headers=JSON).status_code == 202


@pytest.mark.parametrize("cap, minutes", [(8192, 180), (1024, 180), (512, 14 * 60)])
def test_the_same_peaks_give_the_same_answer_from_a_log_and_from_reports(tmp_path, client, clock, cap, minutes):
    """Item 2: the same evidence (peaks, cap, model, group) gives the same advice whether it comes as an SGLang log
    (its decode lines, the cap given with --cap) or as the ranks' reports to the service."""
    def running(minute: int, second: int, dp: int) -> int:
        return 120 + (minute * 7 + dp * 13 + second) % 70

    lines = traffic(minutes, running)
    path = write(tmp_path / "decode.log", decode_lines(LOG, lines))
    log = advise_from_sglang_logs([path], ServerFlags(cap=cap, model="deepseek-v3", tokens_per_request=1, ep_size=8))
    peaks: dict[int, int] = {}
    for at, _, value in lines:
        peaks[int((at - T0) // 60)] = max(peaks.get(int((at - T0) // 60), 0), value)
    post_windows(client, clock, [peaks[window] for window in sorted(peaks)], cap)
    served = client.get("/v1/clusters/fromreports/advice").json()
    from_log = json.loads(log.advice.model_dump_json())
    same = ("action", "recommended_cap", "target_cap", "lower_bound", "upper_bound", "confidence", "low_confidence",
            "sample_count", "max_peak_runtime_tokens", "cap_known", "predicted_overflow_windows_per_day_recommended",
            "predicted_overflow_windows_per_day_recommended_high")
    assert {key: from_log[key] for key in same} == {key: served[key] for key in same}
    decision = [reason for reason in from_log["reasons"] if reason.startswith(("holding", "not lowering", "the "))]
    assert decision[-1] in served["reasons"]
