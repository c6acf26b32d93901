"""A trend from a short history (3-4 days: what operators often keep of their logs): each hour of the day
against the same hour on the other days. Sustained growth is found and sized for; noisy flat traffic, and
one busier day, are not a trend; the advice says how many days it saw and how sure it is."""

from __future__ import annotations

import math
import random

import pytest
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.recommend import recommend
from capwatch.advisor.sample import GroupSample
from capwatch.advisor.trend import hourly_trend
from capwatch.sglang_logs.advise import advise_from_sglang_logs

from tests.service.test_advisor import group
from tests.service.test_advisor_risk import DAY_WINDOWS, POLICY, daily_traffic, history_of
from tests.sglang_logs.logs import decode_lines, traffic, write
from tests.support import sglang_logs as sg

NO_SHORT_TREND = POLICY.model_copy(update={"trend_short_min_days": 60})


@pytest.mark.parametrize("days, growth", [(3, 0.20), (4, 0.10), (3, 0.06)])
def test_growth_sustained_over_a_few_days_is_found_and_sized_for(days, growth):
    peaks = daily_traffic(days, growth_per_day=growth, seed=21, noise=0.25)
    history = history_of(peaks)
    assert len(history.daily_peaks(POLICY.trend_min_day_coverage)) < POLICY.trend_min_days  # too few for daily peaks
    advice = recommend(history, group(4096), POLICY)
    assert advice.trend_significant and advice.trend_rate_per_day == pytest.approx(growth, abs=0.02)
    reason = next(reason for reason in advice.reasons if "hourly peaks" in reason)
    assert f"over {days} days" in reason and "seasonal Mann-Kendall p=" in reason and "day over day" in reason
    horizon_days = POLICY.trend_horizon_s / 86_400
    next_day_peak = max(daily_traffic(days + 1, growth_per_day=growth, seed=21, noise=0.25)[-DAY_WINDOWS:])
    assert advice.recommended_cap >= next_day_peak  # the next day does not overflow
    assert advice.recommended_cap >= max(peaks[-DAY_WINDOWS:]) * math.exp(0.7 * growth * horizon_days)
    assert recommend(history, group(4096), NO_SHORT_TREND).recommended_cap < advice.recommended_cap


@pytest.mark.parametrize("days", [3, 4])
@pytest.mark.parametrize("seed", range(8))
def test_noisy_flat_traffic_over_a_few_days_has_no_growth(days, seed):
    history = history_of(daily_traffic(days, growth_per_day=0.0, seed=300 + seed, noise=0.25))
    advice = recommend(history, group(4096), POLICY)
    assert not (advice.trend_significant and advice.trend_rate_per_day > 0)
    assert advice.recommended_cap == recommend(history, group(4096), NO_SHORT_TREND).recommended_cap


def test_one_busier_day_is_not_a_trend():
    """Flat for two days, then one day 40 % busier: many hours rise at once (the seasonal test alone would
    call it growth), but not day after day."""
    rng = random.Random(4)
    peaks = []
    for window in range(3 * DAY_WINDOWS):
        day_level = 1.4 if window >= 2 * DAY_WINDOWS else 1.0
        diurnal = 0.6 + 0.4 * math.sin(2 * math.pi * (window % DAY_WINDOWS) / DAY_WINDOWS)
        peaks.append(max(1, int(400 * day_level * diurnal * (1.0 + 0.08 * rng.gauss(0.0, 1.0)))))
    history = history_of(peaks)
    found = hourly_trend(history.hourly_peaks(0.5), POLICY.trend_alpha, 3, POLICY.trend_min_rate_per_day)
    assert found is not None and found.p_value < POLICY.trend_alpha and found.rate_per_day > 0
    assert not found.significant and found.day_steps[0] == pytest.approx(0.0, abs=0.03)
    advice = recommend(history, group(4096), POLICY)
    assert not advice.trend_significant
    assert any("every day over the one before" in reason for reason in advice.reasons)


def test_fewer_than_the_short_minimum_of_days_or_hours_longer_than_windows_give_no_trend():
    two_days = history_of(daily_traffic(2, growth_per_day=0.3, seed=1))
    assert hourly_trend(two_days.hourly_peaks(0.5), 0.01, 3, 0.01) is None
    hourly_windows = SampleHistory(POLICY.half_life_s, window_s=7200.0)
    for index in range(60):
        hourly_windows.add(GroupSample(index * 7200.0, 100 + index, 4096), POLICY.bump_factor, POLICY.bump_min_tokens)
    assert hourly_windows.hourly_peaks(0.5) == []


def test_the_hourly_peaks_survive_the_stores_round_trip_and_a_merge():
    peaks = daily_traffic(3, growth_per_day=0.2, seed=8)
    whole = history_of(peaks)
    restored = SampleHistory.from_dict(whole.to_dict())
    assert restored.hourly == whole.hourly and len(whole.hourly) == 72
    half = len(peaks) // 2
    first = history_of(peaks[:half])
    second = history_of(peaks[half:], start_s=1_700_006_400.0 + 60.0 * half)
    assert first.merged(second).hourly == whole.hourly
    assert recommend(restored, group(4096), POLICY) == recommend(whole, group(4096), POLICY)
    legacy = whole.to_dict()
    del legacy["hourly"]  # a history stored before hourly peaks were kept: read, with none
    assert SampleHistory.from_dict(legacy).hourly == {}


def test_three_days_of_sglang_logs_with_growth_are_sized_for_the_next_day(tmp_path):
    """Issue #17 item 10: three days of logs, +20 % a day; the advice holds the fourth day's peak."""
    log = sg.FORMAT["sglang-0.5.19+"]
    start = 1_764_460_800.0  # a UTC midnight

    def running(minute: int, second: int, dp: int) -> int:
        day = minute / 1440
        diurnal = 0.6 + 0.4 * math.sin(2 * math.pi * (minute % 1440) / 1440)
        return int(200 * math.exp(0.2 * day) * diurnal * (1 + 0.1 * ((minute * 7 + dp * 3 + second) % 11 - 5) / 5))

    days = traffic(3 * 1440, running, start_s=start, every_s=30, ranks=2)
    path = write(tmp_path / "server.log", log.start(start - 30, disaggregation_mode="decode") + decode_lines(log, days))
    advice = advise_from_sglang_logs([path]).advice
    fourth_day_peak = max(running(minute, second, dp) for minute in range(3 * 1440, 4 * 1440) for second in (0, 30)
                          for dp in range(2))
    assert advice.trend_significant and advice.trend_rate_per_day == pytest.approx(0.2, abs=0.03)
    assert advice.recommended_cap >= fourth_day_peak > advice.max_peak_runtime_tokens
    assert any("hourly peaks over 3 days" in reason for reason in advice.reasons)
