"""Risk-based sizing (peaks over threshold, generalized Pareto), the trend stage, and the KV-cache trade."""

from __future__ import annotations

import math
import random

import pytest
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.recommend import recommend, whatif
from capwatch.advisor.sample import GroupSample
from capwatch.advisor.tail import fit_pwm, tail_model
from capwatch.advisor.trend import daily_trend, mann_kendall_p
from capwatch.sizing.model_presets import model_geometry, preset_for_geometry

from tests.service.test_advisor import group

POLICY = AdvisorPolicy()
T0 = 1_700_006_400.0  # a UTC midnight
DAY_WINDOWS = 1440


def gpd_sample(rng: random.Random, shape: float, scale: float) -> float:
    u = rng.random()
    return scale * (u ** -shape - 1.0) / shape if shape else -scale * math.log(u)


def history_of(peaks: list[int], start_s: float = T0, cap: int = 4096) -> SampleHistory:
    history = SampleHistory(POLICY.half_life_s, window_s=60.0)
    for index, peak in enumerate(peaks):
        history.add(GroupSample(start_s + 60.0 * index, peak, cap, int(peak > cap)), POLICY.bump_factor,
                    POLICY.bump_min_tokens)
    return history


def exponential_days(days: int, seed: int, base: int = 200, mean_excess: float = 40.0) -> list[int]:
    rng = random.Random(seed)
    return [int(base + rng.expovariate(1.0 / mean_excess)) for _ in range(days * DAY_WINDOWS)]


@pytest.mark.parametrize("shape", [-0.2, 0.0, 0.2])
def test_pwm_recovers_a_known_generalized_pareto(shape):
    rng = random.Random(7)
    fit = fit_pwm([gpd_sample(rng, shape, 100.0) for _ in range(20_000)])
    assert fit.shape == pytest.approx(shape, abs=0.04)
    assert fit.scale == pytest.approx(100.0, rel=0.06)


def test_the_tail_predicts_above_the_largest_sample_with_a_band():
    history = history_of(exponential_days(3, seed=1))
    model = tail_model(history, POLICY)
    assert model.fit is not None and abs(model.fit.shape) < 0.15  # an exponential tail is found
    largest = history.max_peak_runtime_tokens
    caps = [largest + step for step in (0, 40, 80, 160, 320)]
    rates = [model.overflow_windows_per_day(cap) for cap in caps]
    assert rates[0] > rates[1] > 0.0  # above everything seen, still a risk: the empirical histogram says 0
    assert history.usage.share_above(caps[1]) == 0.0
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    for cap in caps:
        low, high = model.band(cap)
        assert low <= model.overflow_windows_per_day(cap) <= high


def test_predictions_are_calibrated_on_fresh_days():
    """Fit on 3 days, count on 30 new days: the observed overflowing windows per day at caps above the
    training max fall inside the band (widened by the Poisson noise of 30 days' counts)."""
    history = history_of(exponential_days(3, seed=2))
    model = tail_model(history, POLICY)
    fresh = exponential_days(30, seed=3)
    for cap in (history.max_peak_runtime_tokens - 40, history.max_peak_runtime_tokens + 30):
        observed = sum(peak > cap for peak in fresh) / 30.0
        low, high = model.band(cap)
        noise = 2.0 * math.sqrt(max(high, 1e-3) / 30.0)
        assert low - noise <= observed <= high + noise, (cap, observed, low, high)


def test_the_recommended_cap_meets_the_risk_target_and_the_whatif_curve_says_so():
    history = history_of(exponential_days(3, seed=4))
    advice = recommend(history, group(4096), POLICY)
    assert advice.tail_fit and advice.action == "lower"
    assert advice.predicted_overflow_windows_per_day_recommended_high <= POLICY.target_overflow_windows_per_day
    assert advice.recommended_cap >= history.max_peak_runtime_tokens
    below = advice.recommended_cap - POLICY.alignment
    rows = whatif(history, group(4096), [below, advice.recommended_cap, 4096], POLICY)
    assert rows[0].predicted_overflow_windows_per_day_high > POLICY.target_overflow_windows_per_day
    per_day = [row.predicted_overflow_windows_per_day for row in rows]
    assert per_day == sorted(per_day, reverse=True)
    assert any("generalized Pareto" in reason for reason in advice.reasons)


def test_few_samples_fall_back_to_the_empirical_histogram_and_the_margin():
    history = history_of([100] * 100 + [300] * 100)  # 20 windows in the top 10 %: too few to fit
    advice = recommend(history, group(4096), POLICY.model_copy(update={"change_min_history_s": 0.0}))
    assert not advice.tail_fit
    assert advice.recommended_cap == 384  # 300 x 1.15 = 345, aligned up: the peaks stage's rule
    assert advice.predicted_overflow_windows_per_day_recommended == 0.0
    assert advice.predicted_overflow_windows_per_day_recommended_high > 0.0  # rule of three, not certainty
    assert any("too few for a tail fit" in reason for reason in advice.reasons)


def daily_traffic(days: int, growth_per_day: float, seed: int, noise: float = 0.08) -> list[int]:
    rng = random.Random(seed)
    peaks = []
    for window in range(days * DAY_WINDOWS):
        level = 400.0 * math.exp(growth_per_day * window / DAY_WINDOWS)
        diurnal = 0.6 + 0.4 * math.sin(2 * math.pi * (window % DAY_WINDOWS) / DAY_WINDOWS)
        peaks.append(max(1, int(level * diurnal * (1.0 + noise * rng.gauss(0.0, 1.0)))))
    return peaks


def test_mann_kendall_exact_p_values():
    assert mann_kendall_p([1, 2, 3, 4, 5]) == (10, pytest.approx(2 / 120))
    assert mann_kendall_p([3, 1, 2]) == (-1, pytest.approx(1.0))
    assert daily_trend([(0, 100), (1, 100)], 0.01, 5, 0.01) is None


def test_days_left_out_do_not_steepen_the_growth_rate():
    """1 %/day growth with a two-week gap (an outage): the rate is per calendar day, as without the gap."""
    rate = math.log(1.01)
    steady = [(day, round(1000 * math.exp(rate * day))) for day in range(10)]
    gapped = [(day, round(1000 * math.exp(rate * day))) for day in (*range(5), *range(19, 24))]
    for days in (steady, gapped):
        found = daily_trend(days, 0.01, 5, 0.0)
        assert found is not None and found.rate_per_day == pytest.approx(rate, rel=0.05)


def test_sustained_growth_is_found_and_sized_for_the_horizon():
    peaks = daily_traffic(7, growth_per_day=0.05, seed=5)
    history = history_of(peaks)
    advice = recommend(history, group(4096), POLICY)
    assert advice.trend_significant and advice.trend_rate_per_day == pytest.approx(0.05, abs=0.015)
    last_day_peak = max(peaks[-DAY_WINDOWS:])
    horizon_days = POLICY.trend_horizon_s / 86_400
    assert advice.recommended_cap >= last_day_peak * math.exp(0.035 * horizon_days)
    assert any("grow" in reason and "a day" in reason for reason in advice.reasons)
    flat = recommend(history, group(4096), POLICY.model_copy(update={"trend_horizon_s": 0.0}))
    assert flat.recommended_cap < advice.recommended_cap  # the horizon is what the growth adds


@pytest.mark.parametrize("seed", range(8))
def test_noisy_flat_traffic_has_no_trend(seed):
    history = history_of(daily_traffic(10, growth_per_day=0.0, seed=100 + seed, noise=0.25))
    advice = recommend(history, group(4096), POLICY)
    assert not advice.trend_significant
    assert advice.recommended_cap == recommend(
        history, group(4096), POLICY.model_copy(update={"trend_min_days": 60})).recommended_cap


def test_decline_is_reported_not_sized_below_the_remembered_peaks():
    peaks = daily_traffic(7, growth_per_day=-0.08, seed=9)
    history = history_of(peaks)
    advice = recommend(history, group(4096), POLICY)
    assert advice.trend_significant and advice.trend_rate_per_day < 0
    assert advice.recommended_cap >= history.estimator_histogram().percentile(1.0)
    assert any("shrink" in reason for reason in advice.reasons)


def test_kv_cache_bytes_per_token_follow_the_published_configs():
    assert model_geometry("deepseek-v3").kv_cache.bytes_per_token() == (512 + 64) * 61 * 2  # MLA
    assert model_geometry("deepseek-v3").kv_cache.bytes_per_token("fp8_e4m3") == (512 + 64) * 61
    assert model_geometry("mixtral-8x7b").kv_cache.bytes_per_token() == 2 * 8 * 128 * 32 * 2  # GQA
    assert preset_for_geometry(7168, 8, 256).kv_cache.attention == "MLA"
    assert preset_for_geometry(1, 1, 1) is None


def test_every_advice_states_the_kv_tokens_its_bytes_buy_or_cost():
    kv = model_geometry("deepseek-v3").kv_cache.bytes_per_token()
    history = history_of(exponential_days(1, seed=6))
    lowered = recommend(history, group(4096, kv_bytes_per_token=kv), POLICY)
    freed_bytes = lowered.workspace_bytes_per_rank_current - lowered.workspace_bytes_per_rank_recommended
    assert lowered.kv_cache_tokens_per_rank_freed == int(freed_bytes / kv) > 0
    assert any(f"{freed_bytes // kv:,} KV-cache tokens per rank" in reason and "frees" in reason
               for reason in lowered.reasons)
    raised = recommend(history_of([5000] * 100), group(1024, kv_bytes_per_token=kv), POLICY)
    assert raised.action == "raise" and raised.kv_cache_tokens_per_rank_freed < 0
    assert any("costs" in reason and "KV-cache tokens" in reason for reason in raised.reasons)
    held = recommend(history_of([900] * 100), group(1024, kv_bytes_per_token=kv), POLICY)
    assert held.action == "hold" and any("holds the room of" in reason for reason in held.reasons)


def test_a_ranks_reported_geometry_finds_its_kv_cost():
    from capwatch.advisor.kv import kv_bytes_per_token_of

    assert kv_bytes_per_token_of(7168, 8, 256) == 70_272  # DeepSeek-V3 / R1: the same MLA cache
    assert kv_bytes_per_token_of(4096, 8, 128) == 2 * 4 * 128 * 94 * 2  # Qwen3-235B-A22B
    assert kv_bytes_per_token_of(1234, 8, 256) is None and kv_bytes_per_token_of(None, 8, 256) is None


@pytest.mark.parametrize("peaks, cap, kv_bytes_per_token, action, tail_fit", [
    (exponential_days(3, seed=4), 4096, None, "lower", True),
    ([100] * 100 + [300] * 100, 4096, 70_272, "lower", False),  # too few for a fit: the empirical band
    (exponential_days(2, seed=9, base=3000), 1024, 70_272, "raise", True),  # costing KV room
], ids=["tail fit", "empirical", "raise"])
def test_the_whatif_at_the_recommended_cap_is_the_advice_s_price_and_forecast(peaks, cap, kv_bytes_per_token, action,
                                                                             tail_fit):
    """One outlook per cap (outlook.py): the what-if curve passes through the advice."""
    history = history_of(peaks, cap=cap)
    policy = POLICY.model_copy(update={"change_min_history_s": 0.0})
    advice = recommend(history, group(cap, kv_bytes_per_token=kv_bytes_per_token), policy)
    assert (advice.action, advice.tail_fit) == (action, tail_fit)
    if kv_bytes_per_token is not None:  # lowering frees KV room, raising costs it
        assert (advice.kv_cache_tokens_per_rank_freed > 0) == (action == "lower")
    row, = whatif(history, group(cap, kv_bytes_per_token=kv_bytes_per_token), [advice.recommended_cap], policy)
    assert (row.workspace_bytes_per_rank, row.workspace_bytes_group, row.workspace_bytes_group_delta,
            row.kv_cache_tokens_per_rank_freed) == (
        advice.workspace_bytes_per_rank_recommended, advice.workspace_bytes_group_recommended,
        advice.workspace_bytes_group_delta, advice.kv_cache_tokens_per_rank_freed)
    assert (row.predicted_overflow_rate, row.predicted_overflow_windows_per_day,
            row.predicted_overflow_windows_per_day_low, row.predicted_overflow_windows_per_day_high) == (
        advice.predicted_overflow_rate_recommended, advice.predicted_overflow_windows_per_day_recommended,
        advice.predicted_overflow_windows_per_day_recommended_low,
        advice.predicted_overflow_windows_per_day_recommended_high)
    assert (kv_bytes_per_token is None) == (row.kv_cache_tokens_per_rank_freed is None)


def test_a_whatif_without_history_prices_each_cap_and_predicts_nothing():
    empty = SampleHistory(POLICY.half_life_s, window_s=60.0)
    rows = whatif(empty, group(1024, kv_bytes_per_token=70_272), [512, 2048], POLICY)
    for row in rows:
        assert (row.predicted_overflow_rate, row.predicted_overflow_windows_per_day,
                row.predicted_overflow_windows_per_day_low, row.predicted_overflow_windows_per_day_high) == (None,) * 4
    assert rows[0].workspace_bytes_per_rank < rows[1].workspace_bytes_per_rank
    assert rows[0].workspace_bytes_group_delta < 0 < rows[1].workspace_bytes_group_delta
    assert rows[0].kv_cache_tokens_per_rank_freed > 0 > rows[1].kv_cache_tokens_per_rank_freed
