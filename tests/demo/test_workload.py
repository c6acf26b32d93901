"""The generated decode workload: rises and falls, bursts, a hot rank, Zipf routing, determinism."""

from __future__ import annotations

import dataclasses

import pytest

from capwatch.demo.workload import (
    WorkloadSpec,
    arrival_rate,
    expert_popularity,
    generate_token_counts,
    runtime_max_tokens,
    scaled_geometry,
)


def mean(values):
    return sum(values) / len(values)


def test_shape_and_determinism():
    spec = WorkloadSpec(ranks=3, steps=200, seed=7)
    counts = generate_token_counts(spec)
    assert len(counts) == 200 and all(len(step) == 3 for step in counts)
    assert all(isinstance(tokens, int) and tokens >= 0 for step in counts for tokens in step)
    assert generate_token_counts(spec) == counts
    assert generate_token_counts(dataclasses.replace(spec, seed=8)) != counts


def test_concurrency_rises_and_falls_with_the_day():
    spec = WorkloadSpec(steps=800, day_steps=800, burst_probability=0.0, hot_rank=None)
    group = [sum(step) for step in generate_token_counts(spec)]
    trough, peak, end = mean(group[:50]), mean(group[350:450]), mean(group[-50:])
    assert peak > 2.5 * trough and peak > 2.5 * end
    # the mean batch at the peak is near what the spec asks for
    assert 0.7 * spec.peak_tokens_per_rank < peak / spec.ranks < 1.3 * spec.peak_tokens_per_rank


def test_bursts_raise_the_peak_above_the_calm_workload():
    calm = WorkloadSpec(steps=1200, burst_probability=0.0, seed=3)
    bursty = dataclasses.replace(calm, burst_probability=0.02, burst_factor=4.0)
    assert max(runtime_max_tokens(generate_token_counts(bursty))) > 1.3 * max(
        runtime_max_tokens(generate_token_counts(calm)))


def test_hot_rank_carries_more_and_sets_r():
    spec = WorkloadSpec(ranks=4, steps=600, hot_rank=2, hot_rank_share=2.0, burst_probability=0.0)
    counts = generate_token_counts(spec)
    per_rank = [mean([step[rank] for step in counts]) for rank in range(4)]
    others = mean([per_rank[rank] for rank in (0, 1, 3)])
    assert 1.6 < per_rank[2] / others < 2.4
    assert mean([step[2] == max(step) for step in counts[100:]]) > 0.9


def test_speculative_tokens_multiply_each_request():
    counts = generate_token_counts(WorkloadSpec(steps=50, speculative_tokens=3))
    assert all(tokens % 4 == 0 for step in counts for tokens in step)


def test_arrival_rate_starts_at_the_trough():
    spec = WorkloadSpec(trough_ratio=0.25)
    assert arrival_rate(spec, 0) == pytest.approx(0.25 * arrival_rate(spec, spec.day_steps // 2))


def test_zipf_expert_popularity():
    weights = expert_popularity(64, exponent=1.0, seed=1)
    assert sum(weights) == pytest.approx(1.0)
    ordered = sorted(weights, reverse=True)
    assert ordered[0] / ordered[1] == pytest.approx(2.0) and ordered[0] / ordered[9] == pytest.approx(10.0)
    assert weights != ordered  # shuffled over expert ids
    assert expert_popularity(8, exponent=0.0) == pytest.approx([1 / 8] * 8)


def test_cpu_geometry_keeps_routing_and_prices_the_real_model():
    geometry = scaled_geometry("deepseek-v3", ep_size=4)
    assert 64 <= geometry.hidden_size <= 256
    assert (geometry.num_experts, geometry.top_k, geometry.priced_hidden_size) == (256, 8, 7168)
    small = scaled_geometry("mixtral-8x7b", ep_size=16)  # 8 experts cannot cover 16 ranks
    assert small.num_experts >= 16 and small.top_k / small.num_experts == pytest.approx(2 / 8)


@pytest.mark.parametrize("settings", [dict(ranks=0), dict(steps=0), dict(trough_ratio=1.5), dict(hot_rank=4),
                                      dict(burst_factor=0.5)])
def test_bad_settings_are_named(settings):
    with pytest.raises(ValueError, match=next(iter(settings))):
        WorkloadSpec(**settings)


def test_unknown_model_lists_the_choices():
    with pytest.raises(ValueError, match="deepseek-v3"):
        scaled_geometry("gpt-5")
