"""The advisor for a backend whose buffer a rank reports (``backends/reported.py``: DeepEP v2, ...): advice on the
backend's own variable, within its limits and above SGLang's floor, priced from the reported bytes (exact at the
cap in use, in proportion at the recommended one)."""

from __future__ import annotations

import pytest
from capwatch.advisor.evidence import GroupConfig
from capwatch.advisor.recommend import recommend
from capwatch.backends import SPECS, pricing_of
from capwatch.backends.reported import ReportedBuffer
from capwatch.telemetry.rank import rank_config
from capwatch.sglang_engine.limits import SGLangLimits

from tests.service.test_advisor import POLICY, day_of, history_from

REPORTED = [name for name, spec in SPECS.items() if spec.bytes_known == "reported"]
GIB = 1 << 30


def group(name: str, cap: int, **kwargs) -> tuple[GroupConfig, int]:
    spec = SPECS[name]
    buffer_bytes = 2 * GIB
    config = rank_config(cap=cap, ep_size=8, hidden_size=7168, top_k=8, num_experts=256, backend=f"x-{name}",
                         a2a_backend=name, **{name: ReportedBuffer(buffer_bytes=buffer_bytes)})
    return GroupConfig(cap=cap, pricing=pricing_of(config, 8), backend=spec.rules,
                       prefill_dispatched=spec.prefill_dispatched(spec.params_of(config)), **kwargs), buffer_bytes


@pytest.mark.parametrize("name", REPORTED)
def test_quiet_decode_lowers_on_its_own_variable_priced_from_the_reported_bytes(name):
    spec = SPECS[name]
    config, reported = group(name, 512)
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(20, 90)), cap=512), config, POLICY)
    assert advice.action == "lower" and advice.recommended_cap == 128
    assert (advice.a2a_backend, advice.cap_variable) == (name, spec.rules.cap_env_var)
    assert advice.env == f"{spec.rules.cap_env_var}=128"
    assert advice.workspace_bytes_per_rank_current == reported  # exact: what the ranks reported at 512
    assert advice.workspace_bytes_per_rank_recommended == reported // 4  # in proportion


@pytest.mark.parametrize("name", REPORTED)
def test_never_below_sglangs_floor_nor_above_the_backends_limit(name):
    spec = SPECS[name]
    limits = SGLangLimits(decode_cuda_graph_max_batch_size=160, tokens_per_request=2, max_prefill_buffer_tokens=256)
    config, _ = group(name, 1024, engine_limits=limits)
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(20, 60)), cap=1024), config, POLICY)
    assert advice.floor_cap == 320 and advice.recommended_cap == 384
    busy, _ = group(name, spec.rules.max_cap_tokens)
    peak = spec.rules.max_cap_tokens
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(peak - 20, peak)), cap=peak), busy,
                       POLICY)
    assert advice.upper_bound <= spec.rules.max_cap_tokens


@pytest.mark.parametrize("name", REPORTED)
def test_a_backend_that_falls_back_is_told_to_raise_to_stop_the_fallback_as_memory_for_speed(name):
    """Mega MoE runs an eager step above its cap on a slower path (no error): its raise says so, priced; a backend
    whose steps above the cap fail says nothing of a fallback."""
    spec = SPECS[name]
    config, reported = group(name, 512)
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(400, 700)), cap=512), config, POLICY)
    assert advice.action == "raise" and advice.recommended_cap > 700
    stop = [reason for reason in advice.reasons if reason.startswith("raise to stop the fallback")]
    if spec.rules.over_cap_fallback is None:
        assert stop == [] and not any("no rank is at risk" in reason for reason in advice.reasons)
        return
    more = advice.workspace_bytes_per_rank_recommended - reported
    assert stop == [f"raise to stop the fallback: above the cap an eager step {spec.rules.over_cap_fallback} (no "
                    f"error, nothing logged); 512 -> {advice.recommended_cap} trades {more / GIB:.2f} GiB more "
                    f"{spec.rules.memory} per rank for the faster path, memory for speed: no rank is at risk at 512, "
                    f"{advice.workspace_bytes_basis}"]  # the recommended cap's bytes: in proportion, an estimate


def test_below_the_floor_a_fallback_backend_is_not_told_its_rank_is_safe():
    """A captured graph above the cap takes Mega MoE's path anyway and asserts: the floor's raise is no fallback."""
    name = next(name for name, spec in SPECS.items() if spec.rules.over_cap_fallback is not None)
    limits = SGLangLimits(decode_cuda_graph_max_batch_size=256, tokens_per_request=1, max_prefill_buffer_tokens=64)
    config, _ = group(name, 128, engine_limits=limits)
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(20, 60)), cap=128), config, POLICY)
    assert advice.action == "raise" and advice.floor_cap == 256
    assert not any("no rank is at risk" in reason for reason in advice.reasons), advice.reasons


@pytest.mark.parametrize("name", REPORTED)
def test_a_change_priced_in_proportion_says_it_is_an_estimate(name):
    """Away from the cap the ranks reported their bytes at, the advice's bytes and KV-cache tokens are an estimate:
    said in a field and in the reasons; at the reported cap itself the bytes are exact."""
    config, reported = group(name, 512, kv_bytes_per_token=70_000)
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(20, 90)), cap=512), config, POLICY)
    assert advice.action == "lower" and advice.recommended_cap == 128
    assert advice.workspace_bytes_exact_current is True  # the bytes the ranks reported, at 512
    assert advice.workspace_bytes_exact_recommended is False and advice.workspace_bytes_reported_cap == 512
    assert advice.workspace_bytes_basis == ("estimated in proportion to the 2.00 GiB per rank reported at cap 512, "
                                            "exact only there")
    priced = [reason for reason in advice.reasons if "per rank" in reason and ("changes" in reason or "KV" in reason)]
    assert len(priced) == 2 and all(advice.workspace_bytes_basis in reason for reason in priced), advice.reasons


@pytest.mark.parametrize("name", REPORTED)
def test_the_reported_cap_itself_is_priced_exact(name):
    config, reported = group(name, 256)
    advice = recommend(history_from(day_of(lambda rng, window, rank: rng.randint(150, 200)), cap=256), config, POLICY)
    assert advice.action == "hold" and advice.recommended_cap == 256, (advice.action, advice.recommended_cap)
    assert advice.workspace_bytes_per_rank_recommended == reported
    assert (advice.workspace_bytes_exact_current, advice.workspace_bytes_exact_recommended) == (True, True)
    assert (advice.workspace_bytes_basis, advice.workspace_bytes_reported_cap) == ("exact", None)
    assert not any("estimated" in reason for reason in advice.reasons)
