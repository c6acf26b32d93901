"""The plugin's cost benchmark (``benchmarks/sglang_dispatch.py``) keeps running: a smoke run, a few calls of each
of its measurements in real SGLang ranks (the newest release, forked from the tests' zygotes). Its timings are not
asserted (nothing timed is trusted in a test); that every measurement ran and produced one is."""

from __future__ import annotations

import math

from benchmarks import sglang_dispatch


def test_a_smoke_run_makes_every_figure_of_the_sglang_dispatch_benchmark():
    figures = sglang_dispatch.run(smoke=True)
    assert "skipped" not in figures, figures
    assert list(figures["per_size"]) == [str(tokens) for tokens in sglang_dispatch.TOKEN_SIZES]
    for entry in figures["per_size"].values():
        assert all(entry[side] > 0 for side in ("bare_median_us", "control_median_us", "plugin_median_us"))
        assert all(math.isfinite(entry[ratio]) and entry[ratio] > 0 for ratio in ("ratio", "control_ratio"))
    assert set(figures["hot_path"]) == {"leader", "other_layer"}
    assert figures["hot_path"]["leader"]["bare_us"] > 0
    in_run = figures["in_run"]
    assert set(in_run) == {"transport_returned_to_step_us", "step_us", "counter_words_us", "clock_pair_us",
                           "step_back_to_back_us", "counter_words_back_to_back_us"}
    assert all(value > 0 for value in in_run.values()), in_run
    assert figures["plugin_ops_leader"]["after_a_wait_us"] > 0
    assert isinstance(figures["meets_goal"], bool)
