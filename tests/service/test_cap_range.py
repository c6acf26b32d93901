"""Issue #20, finding 9: one range for caps everywhere. With SGLang's limits at their schema maxima the advice was
"raise to 1,073,741,824" (46 PB a rank), `plan --budget 999TiB` answered 2,147,483,520, and a report with cap
2^20 made the page ask /whatif for caps above 2^20 (422, no chart). The range is each backend's, in
sizing/backends.py: the advisor, the planner and the what-if never produce or take a cap outside it."""

from __future__ import annotations

import json

import pytest
from capwatch.advisor.floor import deployment_floor
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.recommend import recommend
from capwatch.backends.flashinfer import RULES as FLASHINFER
from capwatch.sizing.caps import MAX_CAP_TOKENS, align_down, align_up
from capwatch.sizing.checks import INT32_MAX, SizingError
from capwatch.sizing.model_presets import model_geometry
from capwatch.sglang_engine.flashinfer import largest_plan_within
from capwatch.sglang_engine.limits import SGLangLimits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service.conftest import T0
from tests.service.test_advisor import group, history_from
from tests.support.simulate import SimulatedRank

SCHEMA_MAXIMA = SGLangLimits(max_prefill_buffer_tokens=MAX_CAP_TOKENS, prefill_cuda_graph_max_batch_size=MAX_CAP_TOKENS,
                             decode_cuda_graph_max_batch_size=MAX_CAP_TOKENS, tokens_per_request=1024)

limits = st.builds(
    SGLangLimits, disaggregation_mode=st.sampled_from(["null", "prefill", "decode"]),
    max_prefill_buffer_tokens=st.integers(0, MAX_CAP_TOKENS),
    prefill_cuda_graph_max_batch_size=st.integers(0, MAX_CAP_TOKENS), decode_cuda_graph_max_batch_size=st.integers(0, MAX_CAP_TOKENS), tokens_per_request=st.integers(1, 1024))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(peaks=st.lists(st.integers(0, INT32_MAX), min_size=1, max_size=40), cap=st.integers(1, MAX_CAP_TOKENS),
       sglang=st.none() | limits, graph=st.none() | st.integers(1, MAX_CAP_TOKENS), spec=st.integers(0, 64),
       policy=st.builds(AdvisorPolicy, alignment=st.sampled_from([1, 100, 128, 4096]), min_samples=st.just(1),
                        min_history_s=st.just(0.0), max_cap=st.integers(4096, MAX_CAP_TOKENS),
                        bump_min_tokens=st.integers(0, MAX_CAP_TOKENS)))
def test_the_advisor_never_produces_a_cap_outside_the_range(peaks, cap, sglang, graph, spec, policy):
    history = history_from([peaks], cap=cap, policy=policy)
    config = group(cap, engine_limits=sglang, cuda_graph_max_batch_size=graph, speculative_tokens=spec)
    floor = deployment_floor(sglang, graph, spec)
    alignment = policy.for_backend(FLASHINFER).alignment
    # No cap both starts the ranks and fits: the floor, aligned up, above the largest cap, aligned down (with an
    # alignment of 100 a floor of 1,048,501 is one: 1,048,600 > 1,048,500, though below 1,048,576).
    if floor is not None and align_up(floor.tokens, alignment) > align_down(FLASHINFER.max_cap_tokens, alignment):
        with pytest.raises(SizingError, match="no cap both starts these ranks and fits"):
            recommend(history, config, policy)
        return
    advice = recommend(history, config, policy)
    for value in (advice.recommended_cap, advice.target_cap, advice.lower_bound, advice.upper_bound):
        assert value is None or 1 <= value <= MAX_CAP_TOKENS, advice
    assert advice.max_cap_tokens == MAX_CAP_TOKENS


def test_a_floor_above_the_largest_cap_is_a_409_for_that_group_alone(client):
    maximal = SimulatedRank("maxima", 0, 1, cap=MAX_CAP_TOKENS)
    body = maximal.report(T0 - 30, T0 - 20, [100])
    body["config"]["sglang"] = json.loads(SCHEMA_MAXIMA.model_dump_json())
    assert client.post("/v1/reports", content=json.dumps(body)).status_code == 202
    normal = SimulatedRank("normal", 0, 1, cap=1024)
    assert client.post("/v1/reports", content=json.dumps(normal.report(T0 - 30, T0 - 20, [100]))).status_code == 202
    refused = client.get("/v1/clusters/maxima/advice")
    assert refused.status_code == 409, refused.text
    assert "1073741824 tokens" in refused.json()["detail"] and "1048576, the largest cap" in refused.json()["detail"]
    listed = {entry["cluster"]: entry for entry in client.get("/v1/clusters").json()}
    assert listed["maxima"]["action"] is None and "no cap both starts" in listed["maxima"]["error"]
    assert client.get("/v1/clusters/normal/advice").status_code == 200


def test_the_what_if_takes_the_range_and_nothing_beyond(client):
    rank = SimulatedRank("edge", 0, 1, cap=MAX_CAP_TOKENS)
    assert client.post("/v1/reports", content=json.dumps(rank.report(T0 - 30, T0 - 20, [900_000]))).status_code == 202
    assert client.get(f"/v1/clusters/edge/whatif?cap=1&cap={MAX_CAP_TOKENS}").status_code == 200
    for beyond in (0, MAX_CAP_TOKENS + 1, 1 << 30):
        refused = client.get(f"/v1/clusters/edge/whatif?cap={beyond}")
        assert refused.status_code == 422 and "outside 1..1048576" in refused.text, refused.text
    advice = client.get("/v1/clusters/edge/advice").json()
    assert advice["max_cap_tokens"] == MAX_CAP_TOKENS and advice["cap_alignment"] == 128  # what the page reads


@pytest.mark.parametrize("budget", [999 << 40, 1 << 42])
def test_the_planners_largest_cap_for_any_budget_is_within_the_range(budget):
    best = largest_plan_within(budget, model_geometry("deepseek-v3"), 8)
    assert best.cap == MAX_CAP_TOKENS


def test_plan_says_when_the_budget_holds_more_than_the_largest_cap(tmp_path):
    from tests.service.test_cli_errors import capwatch

    result = capwatch(tmp_path, "plan", "--model", "deepseek-v3", "--ep-size", "8", "--budget", "999TiB")
    assert result.returncode == 0, result.stderr
    printed = " ".join(result.stdout.split())
    assert "largest 128-aligned cap within budget: 1048576 (the largest cap capwatch sizes" in printed
    beyond = capwatch(tmp_path, "plan", "--model", "deepseek-v3", "--ep-size", "8", "--cap", "2000000")
    assert beyond.returncode == 2 and "cap 2000000 is outside 1..1048576 tokens per rank" in beyond.stderr
