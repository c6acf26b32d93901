"""Real rank processes in a gloo group (ep_size 1, 2, 4): one spawn per world size runs every
scenario; the tests below check what the ranks returned against a single-process reference."""

from __future__ import annotations

import pytest
import torch
from capwatch.backends.flashinfer import RULES as FLASHINFER

from capwatch.demo.ranks import spawn_ranks

from .moe import INVALID_EXPERT_ID, MoECase, expected_received, expected_send_counts, make_inputs, reference_outputs
from .scenarios import run_all

GEOMETRY = {  # world size -> (tokens per rank, num_experts, top_k); experts never divide evenly
    1: ((5,), 3, 2),
    2: ((6, 0), 5, 3),
    4: ((4, 0, 7, 2), 10, 4),
}
HIDDEN = 8
CHUNK_CAP = 2


def cases(world_size: int) -> dict[str, MoECase]:
    tokens, experts, top_k = GEOMETRY[world_size]
    return {
        "fp32": MoECase(11 + world_size, tokens, experts, top_k, HIDDEN),
        "bf16": MoECase(23 + world_size, tokens, experts, top_k, HIDDEN, torch.bfloat16),
        "uniform": MoECase(37 + world_size, (3,) * world_size, experts, top_k, HIDDEN),
    }


def scenario_plan(world_size: int) -> dict:
    case = cases(world_size)
    rows = case["fp32"].runtime_max_tokens_per_rank
    return {
        "fp32": ("moe_step", (case["fp32"], rows + 3)),
        "bf16": ("moe_step", (case["bf16"], rows)),
        "chunked": ("moe_step", (case["fp32"], CHUNK_CAP, "chunk")),
        "over_cap": ("overflow_raise", (case["fp32"], CHUNK_CAP, rows)),
        "local_over_runtime": ("overflow_raise", (case["uniform"], 16, 2)),
        "pairing": ("pairing", (case["fp32"],)),
        "layers": ("shared_layers", (case["fp32"], 3, 2)),
        "overflowing_layers": ("overflowing_layers", (case["fp32"], CHUNK_CAP, 3, 2)),
        "bare_t_over_r": ("bare_backend_more_tokens_than_rows", (case["uniform"],)),
        "host_reads": ("hot_path_without_host_reads", (case["fp32"], CHUNK_CAP)),
    }


@pytest.fixture(scope="module", params=sorted(GEOMETRY), ids=lambda ws: f"ep{ws}")
def run(request):
    world_size = request.param
    return world_size, spawn_ranks(world_size, run_all, scenario_plan(world_size), timeout_s=180)


def test_spawn_ranks_returns_each_rank_result_in_rank_order(run):
    world_size, results = run
    assert [result["group"] for result in results] == [(rank, world_size) for rank in range(world_size)]


def test_dispatch_combine_matches_single_process_moe(run):
    world_size, results = run
    for name, tolerance in (("fp32", dict(rtol=1e-5, atol=1e-5)), ("bf16", dict(rtol=2e-2, atol=2e-2))):
        case = cases(world_size)[name]
        expected = reference_outputs(case, make_inputs(case))
        for rank in range(world_size):
            output = results[rank][name]["output"]
            assert output.dtype == case.dtype and output.shape == expected[rank].shape
            torch.testing.assert_close(output, expected[rank], **tolerance, msg=f"{name} rank {rank}")


def test_received_rows_follow_local_token_order_and_padding_ids_are_invalid(run):
    world_size, results = run
    case = cases(world_size)["fp32"]
    inputs = make_inputs(case)
    for rank in range(world_size):
        got = results[rank]["fp32"]
        rows, counts = expected_received(case, inputs, rank)
        assert torch.equal(got["recv_counts"], counts)
        for source in range(world_size):
            valid = int(counts[source])
            assert torch.equal(got["received_hidden"][source, :valid], rows[source, :valid])
            assert (got["received_ids"][source, valid:] == INVALID_EXPERT_ID).all()
            assert (got["received_ids"][source, :valid] != INVALID_EXPERT_ID).all()


def test_counters_equal_what_was_dispatched(run):
    world_size, results = run
    case = cases(world_size)["fp32"]
    sent = expected_send_counts(case, make_inputs(case))  # [source, target]
    for rank in range(world_size):
        got = results[rank]["fp32"]
        assert torch.equal(got["send_counts"], sent[rank])
        snapshot = got["counters"]
        assert snapshot["tokens_sent_per_rank"] == tuple(sent[rank].tolist())
        assert snapshot["tokens_received_per_rank"] == tuple(sent[:, rank].tolist())
        assert snapshot["tokens_sent"] == int(sent[rank].sum())
        assert snapshot["tokens_received"] == int(sent[:, rank].sum())
        assert (snapshot["dispatch_calls"], snapshot["forward_steps"]) == (1, 1)
        rows = case.runtime_max_tokens_per_rank
        assert snapshot["max_runtime_tokens"] == rows
        assert snapshot["runtime_tokens_histogram"][rows] == 1 and sum(snapshot["runtime_tokens_histogram"]) == 1


def test_chunked_equals_unchunked_and_is_counted(run):
    world_size, results = run
    rows = cases(world_size)["fp32"].runtime_max_tokens_per_rank
    rounds = -(-rows // CHUNK_CAP)
    for rank in range(world_size):
        chunked, whole = results[rank]["chunked"], results[rank]["fp32"]
        assert torch.equal(chunked["output"], whole["output"])
        snapshot = chunked["counters"]
        assert snapshot["overflow_events"][("runtime_over_cap", "chunked")] == 1
        assert snapshot["chunked_rounds"] == rounds
        assert snapshot["dispatch_calls"] == rounds and snapshot["forward_steps"] == 1
        assert snapshot["runtime_tokens_histogram"][-1] == 1  # R > cap lands in the last bin
        assert snapshot["tokens_sent_per_rank"] == whole["counters"]["tokens_sent_per_rank"]


def test_over_cap_raises_a_message_naming_cap_tokens_and_env_and_still_counts(run):
    world_size, results = run
    rows = cases(world_size)["fp32"].runtime_max_tokens_per_rank
    for rank in range(world_size):
        got = results[rank]["over_cap"]
        message = got["message"]
        assert message is not None, "R > cap did not raise"
        assert f"needs {rows} tokens" in message and f"cap is {CHUNK_CAP}" in message
        assert f"{FLASHINFER.cap_env_var}=128" in message
        assert got["counters"]["overflow_events"][("runtime_over_cap", "raised")] == 1
        assert got["counters"]["dispatch_calls"] == 0  # raised before anything was sent
        assert [(e["kind"], e["outcome"], e["suggested_cap"]) for e in got["events"]] == [
            ("runtime_over_cap", "raised", 128)
        ]
        assert any("reporter is down" in note for note in got["notes"])  # the failing hook, as a note
        torch.testing.assert_close(got["output_after"], results[rank]["fp32"]["output"])


def test_local_tokens_over_runtime_raise_and_count(run):
    world_size, results = run
    for rank in range(world_size):
        got = results[rank]["local_over_runtime"]
        assert got["message"] is not None and "3 local tokens" in got["message"]
        assert "runtime_max_tokens_per_rank is 2" in got["message"] and FLASHINFER.cap_env_var in got["message"]
        assert got["counters"]["overflow_events"][("local_over_runtime", "raised")] == 1
        assert got["counters"]["dispatch_calls"] == 0


def test_dispatch_combine_pairing_is_enforced(run):
    world_size, results = run
    for rank in range(world_size):
        errors = results[rank]["pairing"]
        assert "before dispatch" in errors["combine_first"]
        assert "twice without combine" in errors["dispatch_twice"]


def test_layers_share_counters_without_multiplying_steps_and_draft_is_separate(run):
    world_size, results = run
    for rank in range(world_size):
        target, draft = results[rank]["layers"]["target"], results[rank]["layers"]["draft"]
        assert (target["role"], target["forward_steps"], target["dispatch_calls"]) == ("target", 2, 6)
        assert (draft["role"], draft["forward_steps"], draft["dispatch_calls"]) == ("draft", 2, 2)
        assert target["tokens_sent"] == 3 * draft["tokens_sent"]


def test_hot_path_reads_nothing_back_to_the_host(run):
    world_size, results = run
    for rank in range(world_size):
        assert results[rank]["host_reads"] is None, results[rank]["host_reads"]


def test_overflows_are_counted_per_step_not_per_layer(run):
    world_size, results = run
    case = cases(world_size)["fp32"]
    rows = case.runtime_max_tokens_per_rank
    rounds = -(-rows // CHUNK_CAP)
    expected = reference_outputs(case, make_inputs(case))
    for rank in range(world_size):
        chunked = results[rank]["overflowing_layers"]["chunk"]
        counters = chunked["counters"]
        # 3 layers x 2 steps, every one chunked: 2 overflow events, 2 x rounds chunked rounds.
        assert counters["forward_steps"] == 2 and counters["dispatch_calls"] == 3 * 2 * rounds
        assert counters["overflow_events"][("runtime_over_cap", "chunked")] == 2
        assert counters["chunked_rounds"] == 2 * rounds and chunked["events"] == 2
        assert counters["runtime_tokens_sum"] == 2 * rows
        for output in chunked["outputs"]:  # the non-leaders chunk exactly like the leader
            torch.testing.assert_close(output, expected[rank], rtol=1e-5, atol=1e-5)
        raised = results[rank]["overflowing_layers"]["raise"]
        # 2 steps raised by the leader, then one non-leader raising alone: 3 raises, 3 counted.
        assert raised["raised"] == 3 and raised["events"] == 3 and raised["outputs"] == []
        assert raised["counters"]["overflow_events"][("runtime_over_cap", "raised")] == 3
        assert raised["counters"]["forward_steps"] == 2 and raised["counters"]["dispatch_calls"] == 0


def test_a_bare_backend_refuses_more_local_tokens_than_rows(run):
    world_size, results = run
    for rank in range(world_size):
        got = results[rank]["bare_t_over_r"]
        assert got["message"] is not None and "3 local tokens" in got["message"]
        assert "runtime_max_tokens_per_rank is 2" in got["message"] and "overwrite" in got["message"]
        assert got["received_rows"] == 3  # refused before any collective: the group and backend still work
