"""``python -m benchmarks gpu_counting --smoke`` keeps running in CI, on CPU: the real command, a few calls of every
measurement (no figure asserted: on CPU they mean nothing), its counts exact and its per-call ops the design's."""

from __future__ import annotations

import json

from tests.support import launcher


def test_the_gpu_counting_benchmarks_smoke_runs_on_cpu_and_its_counts_are_exact():
    done = launcher.run("-m", "benchmarks", "gpu_counting", "--smoke", "--json", imports_tests=True, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout[done.stdout.index("{"):])
    assert figures["device"] == "cpu" and figures["smoke"] and figures["meets_goal"] is None
    assert figures["sampled_layers"] == [0, 16, 32, 48]
    assert figures["exact"], figures
    for side in ("bare", "counted_other", "counted_sampled", "counted_leader", "bare_control"):
        assert figures["eager_us_per_call_median"][side] > 0
    # On CPU a sampled layer's int32 words go through its int64 record (CUDA adds them in one add_).
    assert figures["eager_ops_per_call"] == {"other": [], "sampled": ["aten::add_", "aten::copy_"],
                                             "leader": ["aten::add_", "aten::copy_"]}
    assert figures["snapshot"]["us_median"] > 0 and not figures["snapshot"]["gpu_busy"]
    assert "graph_added_us_per_layer" not in figures  # captured figures need a GPU
