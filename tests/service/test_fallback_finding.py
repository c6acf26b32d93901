"""A backend that runs an eager step above its cap on a slower path instead of failing (Mega MoE's fallback,
``rules.over_cap_fallback``): ranks whose R went above the cap are a ``cap_fallback`` finding, saying the value that
stops the fallback and what it costs in the backend's bytes, as memory for speed with no rank at risk. Nothing else
shows it: SGLang raises nothing and logs nothing when it falls back."""

from __future__ import annotations

from capwatch.backends import SPECS
from capwatch.backends.reported import ReportedBuffer
from capwatch.service.cluster_view import summarize_cluster
from capwatch.service.sources.contract import RankState
from capwatch.telemetry.rank import rank_config

FALLBACK = next(name for name, spec in SPECS.items() if spec.rules.over_cap_fallback is not None)
FAILING = "deepep_v2"  # a batch above its cap raises
GIB = 1 << 30


def state(name: str, rank: int, max_runtime_tokens: int, cap: int = 256) -> RankState:
    config = rank_config(cap=cap, ep_size=2, hidden_size=7168, top_k=8, num_experts=256, backend=f"x-{name}",
                         a2a_backend=name, **{name: ReportedBuffer(buffer_bytes=2 * GIB)})
    return RankState(cluster="c", role="target", ep_rank=rank, ep_size=2, host=None, received_unix_s=100.0,
                     config=config, last_peak_runtime_tokens=min(max_runtime_tokens, 200),
                     max_runtime_tokens=max_runtime_tokens, forward_steps_total=10)


def findings(states: list[RankState]) -> dict:
    view = summarize_cluster("c", "target", states, now_s=101.0, stale_after_s=60, missing_after_s=600)
    return {finding.kind: finding for finding in view.findings}


def test_ranks_above_the_cap_fell_back_and_raising_stops_it_priced_as_memory_for_speed():
    rules = SPECS[FALLBACK].rules
    found = findings([state(FALLBACK, 0, 300), state(FALLBACK, 1, 250)])["cap_fallback"]
    assert found.ranks == [0] and found.severity == "info"
    assert found.message == (
        f"rank(s) 0 ran steps with R up to 300 tokens per rank, above the cap 256: there the {FALLBACK} A2A "
        f"{rules.over_cap_fallback}, with no error and nothing logged. Set {rules.cap_env_var}=384 to stop the "
        f"fallback; the {rules.memory} goes from 2.00 GiB to 3.00 GiB per rank (in proportion, an estimate): "
        "memory for speed, no rank is at risk")


def test_no_finding_within_the_cap_nor_for_a_backend_that_fails_above_it():
    assert "cap_fallback" not in findings([state(FALLBACK, 0, 256), state(FALLBACK, 1, 12)])
    assert "cap_fallback" not in findings([state(FAILING, 0, 300), state(FAILING, 1, 250)])
