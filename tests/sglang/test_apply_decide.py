"""CAPWATCH_APPLY's pieces that need no SGLang (main venv): the settings, the advice sources (a real
``capwatch serve`` among them), the overflow record, and each guardrail of the decision (sglang_plugin/apply/)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from capwatch.advisor.advice import ClusterAdvice
from capwatch.advisor.floor import Floor
from capwatch.sglang_plugin.apply import advice as advice_source
from capwatch.sglang_plugin.apply import state
from capwatch.sglang_plugin.apply.decide import Shape, decide
from capwatch.sglang_plugin.apply.settings import ApplySettings, ApplySettingsError, load_apply
from capwatch.backends.deepep import RULES as DEEPEP
from capwatch.backends.flashinfer import RULES as FLASHINFER
from hypothesis import given
from hypothesis import strategies as st

from tests.support.ports import free_port

NOW = 1_800_000_000.0
VARIABLE = FLASHINFER.cap_env_var
FLOOR = Floor(512, "the prefill chunk (max prefill buffer) of 512 tokens", "SGLang refuses to start below it")


def advice_json(**changes) -> dict:
    """Advice for the shape below (FlashInfer, EP 2, floor 512): raise 1024 -> 1280, trusted, an hour old."""
    base = {
        "cluster": "prod-a", "role": "target", "generated_unix_s": NOW - 3600, "action": "raise",
        "recommended_cap": 1280, "target_cap": 1200, "lower_bound": 1100, "upper_bound": 1500, "confidence": 0.9,
        "env": f"{VARIABLE}=1280", "low_confidence": False, "a2a_backend": "flashinfer", "cap_variable": VARIABLE,
        "current_cap": 1024, "ep_size": 2, "workspace_bytes_per_rank_current": 1 << 20,
        "workspace_bytes_group_current": 2 << 20, "floor_cap": 512, "budget_cap": None, "sample_count": 500,
        "overflow_windows": 3, "history_s": 90000.0, "covered_history_s": 90000.0, "max_peak_runtime_tokens": 1100,
        "predicted_overflow_rate_current": 0.01, "predicted_overflow_rate_recommended": 0.0,
        "workspace_bytes_per_rank_recommended": 5 << 18, "workspace_bytes_group_recommended": 5 << 19,
        "workspace_bytes_group_delta": 1 << 19, "reasons": ["p99.9 of the group's peaks is 1100 tokens"]}
    return {**base, **changes}


def advice(**changes) -> ClusterAdvice:
    return ClusterAdvice.model_validate(advice_json(**changes))


SHAPE = Shape(FLASHINFER, ep_size=2, floor=FLOOR)
ON = ApplySettings(mode="on")


def run(settings=ON, shape=SHAPE, operator=None, given_advice=None, problem=None, overflow=None, now=NOW):
    return decide(settings, shape, operator, advice() if given_advice is None else given_advice, problem, overflow,
                  now)


# --- settings -------------------------------------------------------------------------------------------------

def test_apply_is_off_unless_asked_and_every_setting_is_read(tmp_path):
    assert load_apply({}).mode == "off" and not load_apply({}).applies
    settings = load_apply({"CAPWATCH_APPLY": "Override", "CAPWATCH_ADVICE_FILE": str(tmp_path / "a.json"),
                           "CAPWATCH_APPLY_MAX_AGE_S": "3600", "CAPWATCH_APPLY_MIN_CONFIDENCE": "0.8",
                           "CAPWATCH_APPLY_WAIT_S": "0.5", "CAPWATCH_APPLY_STATE_FILE": str(tmp_path / "s.json"),
                           "CAPWATCH_APPLY_LOWER_MEM_FRACTION": "1"})
    assert settings == ApplySettings("override", tmp_path / "a.json", 3600.0, 0.8, 0.5, tmp_path / "s.json", True)
    unset = {"XDG_STATE_HOME": str(tmp_path)}
    assert load_apply(unset).state_path(unset) == tmp_path / "capwatch" / "apply-state.json"


@pytest.mark.parametrize("environ, message", [
    ({"CAPWATCH_APPLY": "yes"}, "CAPWATCH_APPLY='yes' must be one of off, dry-run, on, override"),
    ({"CAPWATCH_APPLY": "on", "CAPWATCH_APPLY_WAIT_S": "30"}, "CAPWATCH_APPLY_WAIT_S='30' is outside 0.1..2 seconds"),
    ({"CAPWATCH_APPLY_WAIT_S": "nan"}, "CAPWATCH_APPLY_WAIT_S='nan' is outside"),
    ({"CAPWATCH_APPLY_MAX_AGE_S": "1e12"}, "CAPWATCH_APPLY_MAX_AGE_S='1e12' is outside 60..7.776e+06 seconds"),
    ({"CAPWATCH_APPLY_MIN_CONFIDENCE": "high"}, "CAPWATCH_APPLY_MIN_CONFIDENCE='high' is not a number"),
    ({"CAPWATCH_APPLY_MIN_CONFIDENCE": "2"}, "CAPWATCH_APPLY_MIN_CONFIDENCE='2' is outside 0..1"),
    ({"CAPWATCH_APPLY_LOWER_MEM_FRACTION": "sure"}, "CAPWATCH_APPLY_LOWER_MEM_FRACTION='sure' must be 1 or 0"),
    ({"CAPWATCH_ADVICE_FILE": "a\nb"}, "CAPWATCH_ADVICE_FILE is not a file name"),
])
def test_a_bad_setting_is_one_line_naming_it(environ, message):
    with pytest.raises(ApplySettingsError) as error:
        load_apply(environ)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_plugins_settings_refuse_a_bad_apply_value_in_one_line_and_carry_a_good_one():
    from capwatch.sglang_plugin.settings import SettingsError, load

    with pytest.raises(SettingsError, match="^CAPWATCH_APPLY='always' must be one of off, dry-run, on, override$"):
        load({"CAPWATCH_APPLY": "always"})
    assert load({"CAPWATCH_APPLY": "dry-run"}).apply.mode == "dry-run" and load({}).apply.mode == "off"


# --- the decision: applied, clamped, dry-run --------------------------------------------------------------------

def test_on_sets_the_advised_cap_with_its_revision_and_why():
    outcome = run()
    assert (outcome.cap, outcome.source, outcome.revision) == (1280, "capwatch", int(NOW - 3600))
    assert outcome.line.startswith(f"capwatch: apply (CAPWATCH_APPLY=on): set {VARIABLE}=1280 from advice revision "
                                   f"{int(NOW - 3600)}: raise (p99.9")
    assert "\n" not in outcome.line


def test_dry_run_says_what_it_would_set_and_sets_nothing():
    outcome = run(ApplySettings(mode="dry-run"))
    assert outcome.cap is None and outcome.source == "default"
    assert f"would set {VARIABLE}=1280 from advice revision" in outcome.line and "nothing changed" in outcome.line


def test_the_advised_cap_is_clamped_to_the_floor():
    floor = Floor(1536, "the decode CUDA-graph batch 512 x 3 tokens per request", "SGLang refuses to start below it")
    outcome = run(shape=Shape(FLASHINFER, 2, floor), given_advice=advice(floor_cap=1536))
    assert outcome.cap == 1536 and "raised to the floor 1536: the decode CUDA-graph batch 512 x 3" in outcome.line


@given(advised=st.integers(1, 1024), floor=st.integers(1, 1024))
def test_a_deepep_cap_is_at_least_the_floor_a_multiple_of_128_and_at_most_1024(advised, floor):
    shape = Shape(DEEPEP, 2, Floor(floor, "the decode CUDA-graph batch", "DeepEP asserts"))
    given_advice = advice(a2a_backend="deepep", cap_variable=DEEPEP.cap_env_var, recommended_cap=advised,
                          floor_cap=floor, over_sglang_reserve_bytes_recommended=0)
    outcome = run(shape=shape, given_advice=given_advice)
    if outcome.cap is None:  # only where the clamp moved it off the advised cap: its memory is not priced
        assert "differs from the advised" in outcome.line
        return
    assert outcome.cap >= floor and outcome.cap % 128 == 0 and outcome.cap <= 1024


def test_a_deepep_floor_above_1024_applies_nothing():
    shape = Shape(DEEPEP, 2, Floor(1100, "the prefill chunk of 1100 tokens", "DeepEP asserts"))
    outcome = run(shape=shape, given_advice=advice(a2a_backend="deepep", cap_variable=DEEPEP.cap_env_var,
                                                   recommended_cap=1024, floor_cap=1100))
    assert outcome.cap is None and "is 1152, above 1024 (SGLang asserts the cap <= 1024 at start-up)" in outcome.line


# --- guardrails: each refuses, and says so in one line ---------------------------------------------------------

def test_an_operator_value_is_kept_and_reported_with_on_and_replaced_with_override():
    kept = run(operator="2048")
    assert kept.cap is None and kept.source == "operator"
    assert f"the operator set {VARIABLE}=2048 (CAPWATCH_APPLY=override replaces it)" in kept.line
    assert f"{VARIABLE} stays 2048 (set by the operator)" in kept.line
    replaced = run(ApplySettings(mode="override"), operator="2048")
    assert replaced.cap == 1280 and "replacing the operator's 2048" in replaced.line


@pytest.mark.parametrize("changes, why", [
    ({"generated_unix_s": NOW - 8 * 86400}, "older than CAPWATCH_APPLY_MAX_AGE_S=604800 s"),
    ({"generated_unix_s": NOW + 3600}, "in the future"),
    ({"low_confidence": True, "reasons": ["low confidence: 2 h of covered history"]}, "says low confidence"),
    ({"confidence": 0.3}, "confidence 0.30 is below CAPWATCH_APPLY_MIN_CONFIDENCE=0.5"),
    ({"cap_known": False, "action": "set"}, "action is 'set'"),
    ({"cap_known": False}, "does not know the cap in use (cap_known false)"),
    ({"action": "insufficient_data", "recommended_cap": None}, "action is 'insufficient_data'"),
    ({"ep_size": 4}, "another deployment shape: EP size 4 (this server: 2)"),
    ({"a2a_backend": "deepep", "cap_variable": DEEPEP.cap_env_var}, "backend 'deepep' (this server: 'flashinfer')"),
    ({"floor_cap": 256}, "another deployment shape: floor 256 (this server: 512)"),
])
def test_advice_that_does_not_fit_is_not_applied(changes, why):
    outcome = run(given_advice=advice(**changes))
    assert outcome.cap is None and why in outcome.line, outcome.line
    assert "not applied" in outcome.line and f"{VARIABLE} stays unset (SGLang's default)" in outcome.line


def test_the_age_and_confidence_limits_are_the_settings():
    old = advice(generated_unix_s=NOW - 7200, confidence=0.6)
    assert run(ApplySettings(mode="on", max_age_s=3600), given_advice=old).cap is None
    assert run(ApplySettings(mode="on", min_confidence=0.7), given_advice=old).cap is None
    assert run(given_advice=old).cap == 1280


def test_no_advice_starts_with_what_was_there_and_says_why():
    outcome = decide(ON, SHAPE, None, None, "the service at http://m:1 did not answer within 2 s", None, NOW)
    assert outcome.cap is None and outcome.line.endswith(
        f"not applied: the service at http://m:1 did not answer within 2 s; {VARIABLE} stays unset (SGLang's default)")


def test_after_an_overflow_at_an_applied_cap_that_cap_or_lower_waits_for_newer_advice():
    overflow = state.Overflow(VARIABLE, 1280, int(NOW - 7200), at_unix_s=NOW - 1800)
    same = run(overflow=overflow)  # the advice predates the overflow (an hour old, the overflow half an hour)
    assert same.cap is None and "overflowed at the applied cap 1280" in same.line
    assert run(overflow=overflow, given_advice=advice(recommended_cap=1024)).cap is None  # lower: also refused
    assert run(overflow=overflow, given_advice=advice(recommended_cap=1536)).cap == 1536  # above it: applied
    newer = advice(generated_unix_s=NOW - 60)  # made after the overflow: it knows of it
    assert run(overflow=overflow, given_advice=newer).cap == 1280


def deepep_advice(**changes) -> ClusterAdvice:
    return advice(a2a_backend="deepep", cap_variable=DEEPEP.cap_env_var, recommended_cap=512, floor_cap=128,
                  **changes)


DEEPEP_SHAPE = Shape(DEEPEP, 2, Floor(128, "the decode CUDA-graph batch 128 x 1 token per request", "DeepEP asserts"),
                     mem_fraction_static=0.8, gpu_memory_bytes=80 << 30)


def test_a_deepep_raise_past_sglangs_reserve_is_not_applied_and_says_the_delta():
    outcome = run(shape=DEEPEP_SHAPE, given_advice=deepep_advice(over_sglang_reserve_bytes_recommended=5 << 30))
    assert outcome.cap is None
    assert "takes 5.00 GiB per rank more than SGLang's 2 GiB reserve" in outcome.line
    assert "CAPWATCH_APPLY_LOWER_MEM_FRACTION=1" in outcome.line


def test_with_its_opt_in_the_raise_lowers_mem_fraction_static_by_the_delta():
    opted = ApplySettings(mode="on", lower_mem_fraction=True)
    outcome = run(opted, shape=DEEPEP_SHAPE, given_advice=deepep_advice(over_sglang_reserve_bytes_recommended=8 << 30))
    assert outcome.cap == 512 and outcome.mem_fraction_static == pytest.approx(0.7)  # 0.8 - 8/80
    assert "--mem-fraction-static 0.8 -> 0.7" in outcome.line
    within = run(shape=DEEPEP_SHAPE, given_advice=deepep_advice(over_sglang_reserve_bytes_recommended=0))
    assert within.cap == 512 and within.mem_fraction_static is None
    unknown = run(opted, shape=Shape(DEEPEP, 2, DEEPEP_SHAPE.floor),
                  given_advice=deepep_advice(over_sglang_reserve_bytes_recommended=1 << 30))
    assert unknown.cap is None and "not known to lower it" in unknown.line


# --- the overflow record ----------------------------------------------------------------------------------------

def test_the_overflow_record_keeps_the_highest_cap_and_the_latest_time(tmp_path):
    path = tmp_path / "nested" / "apply-state.json"
    assert state.blocking(path, VARIABLE) is None
    state.record_overflow(path, state.Overflow(VARIABLE, 1024, 7, 100.0))
    state.record_overflow(path, state.Overflow(VARIABLE, 768, 8, 200.0))
    assert state.blocking(path, VARIABLE) == state.Overflow(VARIABLE, 1024, 8, 200.0)
    assert state.blocking(path, DEEPEP.cap_env_var) is None
    path.write_text(json.dumps({VARIABLE: {"cap": "many"}}))
    with pytest.raises(ValueError, match="not an overflow record"):
        state.blocking(path, VARIABLE)


# --- the advice sources -----------------------------------------------------------------------------------------

def test_an_advice_file_in_each_shape_capwatch_prints(tmp_path):
    path = tmp_path / "advice.json"
    other = advice_json(cluster="prod-b", recommended_cap=2048)
    for text in (json.dumps(advice_json()), json.dumps([other, advice_json()]),
                 json.dumps(other) + "\n" + json.dumps(advice_json()) + "\n"):
        path.write_text(text)
        assert advice_source.from_file(path, "prod-a").recommended_cap == 1280


@pytest.mark.parametrize("text, why", [
    (None, "cannot be read"),
    ("{not json", "is not JSON"),
    (json.dumps(advice_json(cluster="prod-b")), "has no advice for cluster 'prod-a' (CAPWATCH_CLUSTER); it has prod-b"),
    (json.dumps([advice_json(), advice_json()]), "has 2 advices for cluster 'prod-a'"),
    (json.dumps({**advice_json(), "recommended_cap": "lots"}), "is not capwatch advice (recommended_cap"),
])
def test_an_advice_file_that_cannot_be_used_says_why(tmp_path, text, why):
    path = tmp_path / "advice.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(advice_source.AdviceUnavailable, match=why.replace("(", r"\(").replace(")", r"\)")):
        advice_source.from_file(path, "prod-a")


def test_a_service_that_accepts_and_never_answers_is_given_up_within_the_wait():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        started = time.monotonic()
        with pytest.raises(advice_source.AdviceUnavailable, match="did not answer within 0.5 s"):
            advice_source.from_service(f"http://127.0.0.1:{listener.getsockname()[1]}", "prod-a", None, 0.5)
        assert time.monotonic() - started < 1.0
    finally:
        listener.close()


def test_a_closed_port_is_unreachable_at_once():
    with pytest.raises(advice_source.AdviceUnavailable, match="is unreachable"):
        advice_source.from_service(f"http://127.0.0.1:{free_port()}", "prod-a", None, 2.0)


def test_advice_from_a_real_capwatch_serve_is_its_advice_endpoints_answer(tmp_path):
    """The service path: a real ``capwatch serve`` with an hour of two ranks' reports; the launcher's fetch
    returns what ``GET /advice`` answers, for its cluster, with the generation time as its revision."""
    import httpx

    from tests.support.service import ServiceProcess
    from tests.support.simulate import SimulatedRank

    with ServiceProcess(tmp_path / "capwatch.db") as server, httpx.Client(base_url=server.url) as client:
        ranks = [SimulatedRank("apply-svc", rank, 2, cap=256) for rank in range(2)]
        start = time.time() - 3600
        for window in range(30):
            for rank in ranks:
                body = rank.report(start + 60 * window, start + 60 * window + 59, [150, 300 if window == 9 else 200])
                assert client.post("/v1/reports", content=json.dumps(body),
                                   headers={"Content-Type": "application/json"}).status_code == 202
        before = time.time()
        fetched = advice_source.from_service(server.url, "apply-svc", None, 2.0)
        answered = client.get("/v1/clusters/apply-svc/advice").json()
        with pytest.raises(advice_source.AdviceUnavailable, match="answered 404"):
            advice_source.from_service(server.url, "nobody", None, 2.0)
    assert (fetched.action, fetched.recommended_cap, fetched.ep_size) == (answered["action"], 512, 2)
    assert int(before) <= advice_source.revision(fetched) <= int(answered["generated_unix_s"])


def test_a_scheduler_records_an_overflow_only_at_a_cap_capwatch_applied(tmp_path):
    from capwatch.sglang_plugin.apply import overflows
    from capwatch.sglang_plugin.apply.applied import record_applied

    path = tmp_path / "apply-state.json"
    environ = {"CAPWATCH_APPLY_STATE_FILE": str(path)}
    assert overflows.recorder(VARIABLE, environ) is None  # nothing applied: nothing to record
    record_applied(VARIABLE, 1280, "capwatch", 1796400000, "applied", environ)
    assert overflows.recorder(VARIABLE, {**environ, VARIABLE: "2048"}) is None  # changed since: not capwatch's cap
    environ[VARIABLE] = "1280"
    on_overflow = overflows.recorder(VARIABLE, environ)
    before = time.time()
    on_overflow(object())
    on_overflow(object())  # once a process
    found = state.blocking(path, VARIABLE)
    assert (found.cap, found.revision) == (1280, 1796400000) and found.at_unix_s >= before
    later = decide(ON, SHAPE, None, advice(generated_unix_s=before - 60), None, found, before + 1)
    assert later.cap is None and "overflowed at the applied cap 1280" in later.line


def test_should_sglangs_check_refuse_the_applied_cap_the_operators_value_is_restored_and_checked(monkeypatch, caplog):
    """``in_resolution``'s fallback (the launcher's wrapper of SGLang's step): the variable and its record are
    restored, one line says so, and SGLang's step runs again on what the operator had."""
    import os

    from capwatch.sglang_plugin.apply import launcher
    from capwatch.sglang_plugin.apply.applied import key, read_applied, record_applied

    monkeypatch.setenv(VARIABLE, "1280")
    monkeypatch.setenv(key(VARIABLE), "")  # the test's own environment is restored whatever happens below
    record_applied(VARIABLE, 1280, "capwatch", 7, "applied")
    monkeypatch.setattr(launcher, "apply_at_start", lambda server_args: (VARIABLE, "4096"))
    seen = []

    def sglang_step(server_args):
        seen.append(os.environ.get(VARIABLE))
        if len(seen) == 1:
            raise ValueError("SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK must cover 2048 tokens\nmore")

    with caplog.at_level("ERROR", logger="capwatch.sglang"):
        launcher.in_resolution(object(), sglang_step)
    assert seen == ["1280", "4096"] and read_applied(VARIABLE) is None
    [line] = [record.getMessage() for record in caplog.records]
    assert f"SGLang refused the applied cap (SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK must cover 2048 " \
           f"tokens); {VARIABLE} restored to 4096" == line.removeprefix("capwatch: apply: ")


def test_a_failure_while_applying_is_one_line_and_sglangs_step_still_runs(monkeypatch, caplog):
    from capwatch.sglang_plugin.apply import launcher

    def broken(server_args):
        raise ValueError("no hidden_size\nsecond line")

    monkeypatch.setattr(launcher, "apply_at_start", broken)
    ran = []
    with caplog.at_level("INFO", logger="capwatch.sglang"):
        launcher.in_resolution(object(), ran.append)
    assert len(ran) == 1
    [line] = [record.getMessage() for record in caplog.records]
    assert line == "capwatch: apply: failed (ValueError: no hidden_size); SGLang starts with the cap as it was set"
