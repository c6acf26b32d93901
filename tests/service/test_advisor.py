"""Advisor scenarios as pure functions: no HTTP, no database."""

from __future__ import annotations

import random

import pytest
from capwatch.advisor.budget import largest_cap_within
from capwatch.advisor.evidence import GroupConfig
from capwatch.advisor.histogram import DecayingHistogram, bucket_index, bucket_range
from capwatch.advisor.history import SampleHistory, overflow_bump
from capwatch.advisor.hysteresis import worth_changing
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.backends.flashinfer import WorkspacePricing
from capwatch.advisor.recommend import recommend, whatif
from capwatch.advisor.sample import RankInterval, group_samples
from capwatch.backends.flashinfer import RULES as FLASHINFER
from capwatch.sizing.flashinfer_moe_a2a import workspace_bytes_per_rank
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token

WINDOW_S = 60.0
DAY_S = 86_400.0
EP_SIZE = 8
PRICING = WorkspacePricing(EP_SIZE, dispatch_bytes_per_token(7168, 8, "bf16"), combine_bytes_per_token(7168))
POLICY = AdvisorPolicy()


def history_from(peaks_by_rank: list[list[int]], cap: int, start_s: float = 1_700_000_000.0,
                 overflow_events: dict[int, int] | None = None, policy: AdvisorPolicy = POLICY) -> SampleHistory:
    """Per-rank interval peaks, one list per rank, one value per window."""
    intervals = []
    for rank, peaks in enumerate(peaks_by_rank):
        for window, peak in enumerate(peaks):
            events = (overflow_events or {}).get(window, 0) if rank == 0 else 0
            intervals.append(RankInterval(rank, start_s + window * WINDOW_S + 5.0, peak, cap, events))
    history = SampleHistory(policy.half_life_s, window_s=WINDOW_S)
    return history.add_all(group_samples(intervals, WINDOW_S), policy.bump_factor, policy.bump_min_tokens)


def day_of(generate, windows: int = int(DAY_S / WINDOW_S), ranks: int = EP_SIZE, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[generate(rng, window, rank) for window in range(windows)] for rank in range(ranks)]


def group(cap: int, **kwargs) -> GroupConfig:
    return GroupConfig(cap=cap, pricing=PRICING, **kwargs)


def test_buckets_are_contiguous_round_up_and_put_caps_on_edges():
    previous_last = -1
    for index in range(bucket_index(1 << 20) + 1):
        first, last = bucket_range(index)
        assert first == previous_last + 1 and last >= first
        assert bucket_index(first) == index and bucket_index(last) == index
        previous_last = last
    for cap in range(128, 8193, 128):  # a cap never splits a bucket
        assert bucket_range(bucket_index(cap))[1] == cap
    widths = [(last - first + 1) / first for first, last in map(bucket_range, range(129, bucket_index(1 << 20)))]
    assert max(widths) <= 1 / 32 + 1e-9


def test_decay_halves_weight_per_half_life_and_reference_shift_keeps_percentiles():
    histogram = DecayingHistogram(half_life_s=100.0)
    histogram.add(10, time_s=0.0)
    histogram.add(20, time_s=100.0)
    assert histogram.weights[bucket_index(20)] == pytest.approx(2 * histogram.weights[bucket_index(10)])
    assert histogram.percentile(0.5) == 20  # the newer sample weighs 2/3
    histogram.add(30, time_s=100.0 * 150)  # exponent > 100: reference shifts and weights rescale
    assert histogram.reference_s == 100.0 * 150
    assert histogram.percentile(1.0) == 30 and histogram.percentile(0.0) == 10
    assert histogram.share_above(20) == pytest.approx(1.0, rel=1e-6)


def test_over_provisioned_cap_is_lowered_with_bytes_saved():
    history = history_from(day_of(lambda rng, w, r: rng.randint(150, 300)), cap=4096)
    advice = recommend(history, group(4096), POLICY)
    assert advice.action == "lower"
    assert 300 < advice.recommended_cap <= 384  # 300 x 1.15 = 345, aligned up to 128
    assert advice.predicted_overflow_rate_recommended == 0.0
    assert advice.workspace_bytes_per_rank_recommended == PRICING.bytes_per_rank(advice.recommended_cap)
    assert advice.workspace_bytes_group_delta == (advice.workspace_bytes_per_rank_recommended
                                                  - advice.workspace_bytes_per_rank_current) * EP_SIZE < 0
    assert advice.env == f"{FLASHINFER.cap_env_var}={advice.recommended_cap}"


def test_overflowing_cap_is_raised_above_the_peak():
    peaks = day_of(lambda rng, w, r: rng.randint(200, 300) if w % 50 else 410)
    history = history_from(peaks, cap=256, overflow_events={w: 1 for w in range(0, 1440, 50)})
    advice = recommend(history, group(256), POLICY)
    assert advice.action == "raise"
    assert advice.recommended_cap > 410 and advice.recommended_cap % 128 == 0
    assert advice.predicted_overflow_rate_current > 0.1
    assert advice.predicted_overflow_rate_recommended == 0.0
    assert advice.workspace_bytes_group_delta > 0


def test_overflow_raises_even_with_short_history():
    history = history_from([[100, 100, 700]], cap=512, overflow_events={2: 3})
    advice = recommend(history, group(512), POLICY)
    assert advice.action == "raise" and advice.recommended_cap > 700


def test_comfortably_full_cap_is_held():
    history = history_from(day_of(lambda rng, w, r: rng.randint(700, 860)), cap=1024)
    advice = recommend(history, group(1024), POLICY)
    assert advice.action == "hold"
    assert advice.recommended_cap == 1024 and advice.predicted_overflow_rate_current == 0.0
    assert advice.lower_bound <= 1024 <= advice.upper_bound


def test_short_history_is_insufficient_data_not_a_guess():
    history = history_from([[100] * 5] * EP_SIZE, cap=4096)
    advice = recommend(history, group(4096), POLICY)
    assert advice.action == "insufficient_data"
    assert advice.recommended_cap is None and advice.env is None
    assert "at least 20 samples" in advice.reasons[0]


def test_rare_bursts_are_not_averaged_away():
    # 3 bursts to 1500 in a day of ~200-token windows: the cap must cover them.
    bursts = {100, 700, 1300}
    history = history_from(day_of(lambda rng, w, r: 1500 if (w in bursts and r == 3) else rng.randint(150, 250)),
                           cap=4096)
    advice = recommend(history, group(4096), POLICY)
    assert advice.recommended_cap >= 1500 * 1.15
    assert advice.predicted_overflow_rate_recommended == 0.0


def test_a_hot_rank_sets_the_group_cap():
    history = history_from(day_of(lambda rng, w, r: rng.randint(900, 1000) if r == 5 else rng.randint(100, 200)),
                           cap=4096)
    advice = recommend(history, group(4096), POLICY)
    assert advice.max_peak_runtime_tokens >= 900
    assert advice.recommended_cap >= 1000 * 1.15 and advice.action == "lower"


def test_floor_from_cuda_graph_batch_and_speculative_tokens():
    history = history_from(day_of(lambda rng, w, r: rng.randint(50, 100)), cap=4096)
    advice = recommend(history, group(4096, cuda_graph_max_batch_size=256, speculative_tokens=3), POLICY)
    assert advice.floor_cap == 1024
    assert advice.action == "lower" and advice.recommended_cap == 1024
    below = recommend(history, group(512, cuda_graph_max_batch_size=256, speculative_tokens=3), POLICY)
    assert below.action == "raise" and below.recommended_cap == 1024


def test_budget_clamps_the_recommendation_to_what_fits():
    budget = PRICING.bytes_per_rank(1024) + 1000  # 1024 fits, 1152 does not
    policy = AdvisorPolicy(budget_bytes_per_rank=budget)
    history = history_from(day_of(lambda rng, w, r: rng.randint(1200, 1500)), cap=512)
    advice = recommend(history, group(512), policy)
    assert advice.budget_cap == 1024 and advice.recommended_cap == 1024 and advice.action == "raise"
    assert advice.workspace_bytes_per_rank_recommended <= budget
    assert advice.predicted_overflow_rate_recommended > 0  # honest: the budget leaves overflows
    assert any("budget" in reason for reason in advice.reasons)
    assert largest_cap_within(budget, PRICING, 128, FLASHINFER.max_cap_tokens) == 1024
    assert largest_cap_within(PRICING.bytes_per_rank(128) - 1, PRICING, 128, FLASHINFER.max_cap_tokens) is None


def test_alignment_is_honoured():
    history = history_from(day_of(lambda rng, w, r: rng.randint(150, 300)), cap=4096)
    for alignment in (64, 128, 256):
        advice = recommend(history, group(4096), AdvisorPolicy(alignment=alignment, min_cap=alignment))
        assert advice.recommended_cap % alignment == 0 and advice.recommended_cap >= 300 * 1.15


def test_hysteresis_holds_small_changes_and_acts_outside_bounds():
    assert worth_changing(1024, 1152, 900, 2048, DAY_S, 43_200, 0.10)[0] is True  # 12.5 % after a day
    assert worth_changing(1024, 1088, 900, 2048, DAY_S, 43_200, 0.10)[0] is False  # 6 %
    assert worth_changing(1024, 1152, 900, 2048, 3_600, 43_200, 0.10)[0] is False  # too little history
    assert worth_changing(4096, 512, 300, 1024, 3_600, 43_200, 0.10)[0] is True  # above upper
    # Through the whole chain: 6 h of history at 1000-ish with cap 1280 -> inside the wide bounds -> hold.
    history = history_from(day_of(lambda rng, w, r: rng.randint(800, 1000), windows=360), cap=1280)
    assert recommend(history, group(1280), POLICY).action == "hold"


def test_overflow_bump_is_based_on_use_and_does_not_compound():
    assert overflow_bump(300, 256) == 360
    assert overflow_bump(100, 1024, min_tokens=16) == int(1024 * 1.2 + 0.999)
    history = history_from([[300] * 30], cap=256, overflow_events={w: 1 for w in range(30)})
    assert history.bumps.percentile(1.0) == bucket_range(bucket_index(360))[1]


def test_whatif_prices_caps_and_predicts_overflow_rates():
    history = history_from([[100] * 50 + [600] * 50], cap=1024)
    rows = whatif(history, group(1024), [512, 700, 1024], POLICY)
    assert [row.predicted_overflow_rate for row in rows] == [pytest.approx(0.5, abs=0.01), 0.0, 0.0]  # later samples weigh a bit more
    assert rows[0].workspace_bytes_per_rank == workspace_bytes_per_rank(
        EP_SIZE, 512, PRICING.dispatch_bytes_per_token, PRICING.combine_bytes_per_token)
    assert rows[2].workspace_bytes_group_delta == 0 and rows[1].aligned is False


def test_history_round_trips_and_folding_keeps_the_advice():
    peaks = day_of(lambda rng, w, r: rng.randint(150, 300))
    whole = history_from(peaks, cap=4096)
    first = history_from([p[:700] for p in peaks], cap=4096)
    rest = history_from([p[700:] for p in peaks], cap=4096, start_s=1_700_000_000.0 + 700 * WINDOW_S)
    folded = SampleHistory.from_dict(first.to_dict()).merged(rest)
    assert recommend(folded, group(4096), POLICY) == recommend(whole, group(4096), POLICY)


def test_a_budget_no_cap_fits_is_said_in_the_advice_never_dropped():
    """Issue #36, finding 8 (F25): CAPWATCH_ADVISOR__BUDGET_BYTES_PER_RANK=100000, too small for any cap: the group
    was advised to raise to 7,040 (0.38 GiB per rank) and no reason mentioned the budget (``plan`` refuses it)."""
    policy = AdvisorPolicy(budget_bytes_per_rank=100_000)
    history = history_from(day_of(lambda rng, w, r: rng.randint(1200, 1500)), cap=512)
    advice = recommend(history, group(512), policy)
    said = [reason for reason in advice.reasons if "no cap fits the memory budget of 100,000 bytes" in reason]
    assert said, advice.reasons
    assert "CAPWATCH_ADVISOR__BUDGET_BYTES_PER_RANK" in said[0] and "raise the budget" in said[0]
    assert advice.budget_cap is None
