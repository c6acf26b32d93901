"""Advice quality on generated decode traces: capwatch's advisor against three baselines.

For each trace: fit every policy on a training window (the first days), then replay the next
day and count the steps whose R exceeds the cap (each one a crash under SGLang's asserts, or
a chunked dispatch) and price the workspace per rank with FlashInfer's formula at the real
model's geometry (DeepSeek-V3, bf16, EP 8). Policies: a static 4096 (SGLang's default), KRR's
max × 1.15, VPA's p90 × 1.15 of the windowed peaks, and ours (the service's advisor chain,
called as pure functions, no HTTP, starting from a current cap of 4096).

Columns: ``cap`` each policy's setting after training; ``overflow_steps`` steps of the test day
with R above it; ``workspace_gib_per_rank`` FlashInfer's workspace at that cap; ``workspace_vs_static``
against 4096. Traces: a diurnal ramp with bursts, more and larger bursts, a hot rank, speculative
decoding with 3 draft tokens, a rare large burst that the test day exceeds, and traffic that grows by
25 % on the test day.

``multi_day`` (benchmarks/advice_suites.py): a week of one-minute windows at SGLang's real clock per suite
(growth, daily bursts, speculative decoding, a unified server whose floor binds, a PD decode server, a hot
DP rank, a regime change), scored on day 8: overflowing windows and bytes against the oracle (the smallest
aligned cap with no overflow that day, never below SGLang's floor), static 4096 / KRR / VPA / capwatch.
Goal: zero day-8 overflows at <= 1.25x the oracle's bytes. ``short_histories``: the same for growth seen over
3 days (+20 %/day) and 4 days (+10 %/day) only, scored on the next day: too few daily peaks for their trend,
so the hourly peaks' (each hour against the same hour on the other days) must find it.
``python -m benchmarks advice_quality [--quick] [--json]``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

from capwatch.advisor.evidence import GroupConfig
from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.backends.flashinfer import WorkspacePricing
from capwatch.advisor.recommend import recommend
from capwatch.advisor.sample import GroupSample
from capwatch.sizing.payloads import combine_bytes_per_token, dispatch_bytes_per_token

from benchmarks.advice_suites import SHORT_SUITES, run_suites
from capwatch.demo.workload import WorkloadSpec, generate_token_counts, runtime_max_tokens

EP_SIZE = 8
HIDDEN_SIZE, TOP_K = 7168, 8  # DeepSeek-V3
STATIC_CAP = 4096
SECONDS_PER_DAY = 86_400.0
WINDOW_STEPS = 25  # steps per advisor window (one group sample)


def pricing() -> WorkspacePricing:
    return WorkspacePricing(EP_SIZE, dispatch_bytes_per_token(HIDDEN_SIZE, TOP_K, "bf16"),
                            combine_bytes_per_token(HIDDEN_SIZE))


def scenarios(quick: bool) -> dict[str, tuple[WorkloadSpec, WorkloadSpec]]:
    """name -> (training spec, test spec). A 'day' is ``day_steps`` steps; training covers 3 days."""
    day = 1200 if quick else 4000
    base = WorkloadSpec(ranks=EP_SIZE, day_steps=day, steps=3 * day, peak_tokens_per_rank=384,
                        mean_decode_steps=80, burst_probability=0.004, burst_steps=15, burst_factor=2.5, seed=11)

    def pair(**changes):
        train = dataclasses.replace(base, **changes)
        return train, dataclasses.replace(train, steps=day, seed=train.seed + 1000)

    grown_train, grown_test = pair(seed=17)
    return {
        "diurnal": pair(),
        "bursty": pair(burst_probability=0.02, burst_factor=4.0, seed=12),
        "hot rank": pair(hot_rank=3, hot_rank_share=2.5, seed=13),
        "speculative (3 draft tokens)": pair(speculative_tokens=3, peak_tokens_per_rank=512, seed=14),
        "rare big burst": pair(burst_probability=0.0008, burst_steps=25, burst_factor=6.0, seed=15),
        "traffic grows 25%": (grown_train, dataclasses.replace(
            grown_test, peak_tokens_per_rank=int(base.peak_tokens_per_rank * 1.25))),
    }


def window_peaks(runtime_tokens: list[int]) -> list[int]:
    return [max(runtime_tokens[i:i + WINDOW_STEPS]) for i in range(0, len(runtime_tokens), WINDOW_STEPS)]


def percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def ours(runtime_tokens: list[int], day_steps: int, current_cap: int) -> tuple[int, str]:
    """The service's chain on the training window: group samples -> history -> recommend."""
    policy = AdvisorPolicy()
    seconds_per_step = SECONDS_PER_DAY / day_steps
    window_s = WINDOW_STEPS * seconds_per_step
    history = SampleHistory(policy.half_life_s, window_s=window_s)
    for index, peak in enumerate(window_peaks(runtime_tokens)):
        history.add(GroupSample(index * window_s, peak, current_cap,
                                overflow_events=int(peak > current_cap)), policy.bump_factor, policy.bump_min_tokens)
    advice = recommend(history, GroupConfig(cap=current_cap, pricing=pricing()), policy)
    return (advice.recommended_cap or current_cap), advice.action


def evaluate(train: list[int], test: list[int], day_steps: int) -> list[dict]:
    peaks = window_peaks(train)
    caps = {
        "static 4096": (STATIC_CAP, "-"),
        "KRR max x 1.15": (math.ceil(max(train) * 1.15), "-"),
        "VPA p90 x 1.15": (math.ceil(percentile(peaks, 0.90) * 1.15), "-"),
        "capwatch": ours(train, day_steps, STATIC_CAP),
    }
    static_bytes = pricing().bytes_per_rank(STATIC_CAP)
    rows = []
    for policy, (cap, action) in caps.items():
        overflow_steps = sum(r > cap for r in test)
        workspace = pricing().bytes_per_rank(cap)
        rows.append({
            "policy": policy, "cap": cap, "action": action, "overflow_steps": overflow_steps,
            "overflow_step_rate": round(overflow_steps / len(test), 5),
            "workspace_gib_per_rank": round(workspace / 2**30, 3),
            "workspace_vs_static": round(workspace / static_bytes, 3),
        })
    return rows


def run(quick: bool = False) -> dict:
    started = time.perf_counter()
    results: dict[str, list[dict]] = {}
    summary: dict[str, dict] = {}
    for name, (train_spec, test_spec) in scenarios(quick).items():
        train = runtime_max_tokens(generate_token_counts(train_spec))
        test = runtime_max_tokens(generate_token_counts(test_spec))
        rows = evaluate(train, test, train_spec.day_steps)
        for row in rows:
            row["trace"] = name
            row["train_peak_r"], row["test_peak_r"] = max(train), max(test)
        results[name] = rows
        for row in rows:
            totals = summary.setdefault(row["policy"], {"overflow_steps": 0, "test_steps": 0, "workspace_gib": []})
            totals["overflow_steps"] += row["overflow_steps"]
            totals["test_steps"] += len(test)
            totals["workspace_gib"].append(row["workspace_gib_per_rank"])
    policies = {
        policy: {
            "overflow_steps": totals["overflow_steps"],
            "overflow_step_rate": round(totals["overflow_steps"] / totals["test_steps"], 5),
            "traces_with_overflow": sum(1 for rows in results.values() for row in rows
                                        if row["policy"] == policy and row["overflow_steps"]),
            "mean_workspace_gib_per_rank": round(sum(totals["workspace_gib"]) / len(totals["workspace_gib"]), 3),
        }
        for policy, totals in summary.items()
    }
    multi_day = run_suites(quick)
    short = run_suites(quick, SHORT_SUITES)
    columns = ("trace", "policy", "cap", "action", "train_peak_r", "test_peak_r", "overflow_steps",
               "overflow_step_rate", "workspace_gib_per_rank", "workspace_vs_static")
    return {
        "geometry": f"DeepSeek-V3 (H={HIDDEN_SIZE}, top-{TOP_K}), bf16, EP {EP_SIZE}",
        "traces": len(results),
        "test_steps_per_trace": next(iter(scenarios(quick).values()))[1].steps,
        "policies": policies,
        "multi_day": {key: value for key, value in multi_day.items() if key != "rows"},
        "short_histories": {key: value for key, value in short.items() if key != "rows"},
        "seconds": round(time.perf_counter() - started, 2),
        "tables": {
            "per trace (fit on 3 days, then the next day)":
                [{column: row[column] for column in columns} for rows in results.values() for row in rows],
            "multi-day suites (fit on 7 days, scored on day 8)": multi_day["rows"],
            "short histories (fit on 3 or 4 days of growth, scored on the next day)": short["rows"],
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=2))
