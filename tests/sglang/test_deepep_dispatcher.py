"""SGLang 0.5.23's own DeepEP dispatcher classes on CPU, in gloo ranks: ``create_moe_dispatcher`` builds a
``MaybeTboDeepEPDispatcher`` per MoE layer, whose ``DeepEPDispatcher``s drive the low-latency path over the
``deep_ep.Buffer`` stand-in (``deepep_standin.py``). What SGLang does with DeepEP — one buffer per process
sized by ``DeepEPBuffer.get_deepep_buffer``, shared by every layer and both micro-batches of two-batch overlap,
each rank's own batch checked against the cap by DeepEP, not SGLang — holds here as the plugin and the sizing
assume it."""

from __future__ import annotations

import pytest
import torch
from capwatch.sglang_engine.deepep import plan_deepep_buffer
from capwatch.sizing.model_presets import custom_geometry

from tests.sglang.deepep_standin import DEEPEP_ASSERT
from tests.sglang.ranks import START_TIMEOUT_S, RankRun

WORLD = 2
CAP = 128
MODEL = {"hidden_size": 2048, "top_k": 2, "num_experts": 8}  # a hidden size DeepEP's kernels run
GEOMETRY = custom_geometry(MODEL["hidden_size"], MODEL["top_k"], MODEL["num_experts"])


def run_ranks(tmp_path, plan: dict) -> RankRun:
    env = {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": str(CAP)}
    run = RankRun(tmp_path, WORLD, env, program="tests.sglang.deepep_rank_program")
    return run.start({"deepep_model": MODEL, **plan})


def wait_for_the_failing_rank(run: RankRun, rank: int) -> int:
    """The rank's exit code; then the others, left waiting in the collective it never joined, are stopped."""
    try:
        return run.processes[rank].wait(timeout=START_TIMEOUT_S)
    finally:
        run.kill()


def check_steps(run: RankRun) -> int:
    """Every combine gives back 2 x each token times its routing weights' sum (the expert stand-in doubles its
    rows), and every rank received exactly the (token, expert) pairs the ranks routed to its experts."""
    records = [run.record(rank) for rank in range(WORLD)]
    local = MODEL["num_experts"] // WORLD
    steps = len(records[0]["steps"])
    for index in range(steps):
        routed = [records[rank]["steps"][index]["ids"] for rank in range(WORLD)]
        for rank, record in enumerate(records):
            done = record["steps"][index]
            expected = done["x"].float() * 2 * done["weights"].sum(1, keepdim=True)
            # FP8 carries 3 mantissa bits: 6.25 % of each value at most, one scale per 128 channels.
            torch.testing.assert_close(done["combined"].float(), expected, atol=0.05, rtol=0.07)
            pairs = torch.cat(routed).flatten()
            mine = [int(((pairs // local == rank) & (pairs % local == expert)).sum()) for expert in range(local)]
            assert done["received"].tolist() == mine, (index, rank)
    return steps


@pytest.mark.timeout(900)
def test_decode_steps_with_two_batch_overlap_then_deepeps_assertion_ends_the_rank(tmp_path):
    """SGLang's defaults (--deepep-mode auto, FP8 dispatch) with two-batch overlap; the last step puts one more
    token than the cap on rank 0 alone: DeepEP refuses it on that rank (SGLang has no check of its own)."""
    plan = {"deepep_mode": "auto", "dispatch_dtype": "fp8", "two_batch_overlap": True,
            "layers": [3, 1],
            "steps": [{"tokens": [3, 5]}, {"micro_batches": [[2, 4], [CAP, 1]]}, {"tokens": [0, 7]},
                      {"tokens": [CAP + 1, 3]}]}
    run = run_ranks(tmp_path, plan)
    assert wait_for_the_failing_rank(run, 0) != 0
    assert DEEPEP_ASSERT in run.log(0), run.logs()
    # 2 layers x (1 + 2 micro-batches + 1) dispatches before the one DeepEP refused, checked on both ranks.
    assert check_steps(run) == 2 * 4
    planned = plan_deepep_buffer(GEOMETRY, WORLD, CAP, "auto")
    assert planned.num_nvl_bytes > 0  # auto mode: normal mode's NVLink buffer too
    for rank in range(WORLD):
        # One buffer per process, built at the first dispatch, shared by both layers and both micro-batches.
        assert run.record(rank)["buffers"] == [(planned.num_nvl_bytes, planned.num_rdma_bytes, True,
                                                planned.nvshmem_qp_depth)]
