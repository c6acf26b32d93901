"""CAPWATCH_APPLY in SGLang's own launcher, on every verified release's released wheel (0.5.19 - 0.5.23; the
release and ``apply`` in each test id): capwatch loaded by ``load_plugins()`` through its entry point, SGLang's real
resolution (``resolve_once``: its pipeline and its own start-up checks) in a launcher process
(``apply_launcher_program.py``), advice from a real ``capwatch serve`` saved as the advice file, then two scheduler
ranks given the launcher's environment after resolution (what SGLang's spawned schedulers inherit) and its
resolved, pickled arguments, which build their FlashInfer dispatchers with the applied cap.

The advice file is the service's ``GET /advice`` answer for the deployment (its backend, EP size, floor: what the
two ranks reported), with its decision replaced by a trusted raise: seconds of history give no trusted advice.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from capwatch.sglang_plugin.apply.applied import read_applied

from tests.sglang import zygotes
from tests.sglang.ranks import MODEL, MODEL_CONFIG, START_TIMEOUT_S, UNSET, RankRun, sglang_python
from tests.sglang.releases import RELEASES, release_path
from tests.sglang.test_deepep_dispatcher import MODEL as DEEPEP_MODEL
from tests.support import launcher
from tests.support.ports import free_port_pair
from tests.support.service import ServiceProcess

NEWEST = RELEASES[-1]
VARIABLE = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
ADVISED = 2560  # above every release's floor for this server (the prefill chunk 2048 at most): applied as advised
PLAN = {"target_layers": [1, 0], "steps": [{"dp_tokens": [3, 5]}, {"dp_tokens": [7, 2]}]}


def release_id(release: str) -> str:
    return f"apply-sglang-{release}"


@dataclass
class Launched:
    """One launcher's resolution: SGLang's error or none, the environment it leaves, its log."""

    folder: Path
    outcome: dict
    environment: dict[str, str]
    log: str

    def lines(self) -> list[str]:
        return [line for line in self.log.splitlines() if "capwatch: apply" in line]


def launch(folder: Path, release: str, env: dict[str, str], backend: str = "flashinfer",
           server_args: dict | None = None, **plan) -> Launched:
    """SGLang's launcher of ``release`` resolving the plan's server with ``env`` (forked from a zygote)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model").mkdir(exist_ok=True)
    (folder / "model" / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (folder / "plan.json").write_text(json.dumps({"world": 2, "model_dir": str(folder / "model"), "model": MODEL,
                                                  "backend": backend, "server_args": server_args or {}, **plan}))
    log = folder / "launcher.log"
    args = ("tests.sglang.apply_launcher_program", str(folder))
    if zygotes.fresh_ranks():
        with open(log, "wb") as out:
            process = launcher.start("-m", *args, python=sglang_python(), env=env, unset=UNSET, imports_tests=True,
                                     cwd=folder, stdout=out, stderr=-2, path_first=release_path(release))
    else:
        process = zygotes.start_rank(*args, python=sglang_python(), env=env, unset=UNSET, cwd=folder, log=log,
                                     path_first=release_path(release), ready_timeout_s=START_TIMEOUT_S)
    code = process.wait(timeout=START_TIMEOUT_S)
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]
    return Launched(folder, json.loads((folder / "launcher.json").read_text()),
                    json.loads((folder / "launcher-env.json").read_text()), text)


def base_env(**extra: str) -> dict[str, str]:
    return {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": "apply",
            "CAPWATCH_METRICS_BASE_PORT": str(free_port_pair()), **extra}  # two ranks: base and base + 1


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service") / "capwatch.sqlite3").start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture(scope="module", autouse=True)
def warm_zygotes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm")
    for release in RELEASES:
        RankRun(folder, 2, base_env(), sglang_release=release).warm()


def service_advice(folder: Path, release: str, service: ServiceProcess) -> dict:
    """The service's advice for this release's deployment: two of its ranks with the plugin report to it."""
    cluster = f"apply-{release.replace('.', '-')}"
    run = RankRun(folder, 2, base_env(CAPWATCH_SERVICE_URL=service.url, CAPWATCH_CLUSTER=cluster,
                                      CAPWATCH_REPORT_INTERVAL_S="0.5"), sglang_release=release).start(PLAN)
    run.wait_ready()
    assert run.release() == [0, 0], run.logs()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{service.url}/v1/clusters/{cluster}/advice", timeout=10) as response:
        answer = json.loads(response.read())
    return {**answer, "cluster": "apply"}


def trusted_raise(answer: dict, cap: int = ADVISED, **changes) -> dict:
    """The service's answer with its decision replaced: raise to ``cap``, trusted, made now."""
    return {**answer, "action": "raise", "recommended_cap": cap, "target_cap": cap, "confidence": 0.9,
            "low_confidence": False, "generated_unix_s": time.time(), "reasons": ["the test's trusted raise"],
            **changes}


@pytest.fixture(scope="module", params=RELEASES, ids=release_id)
def applied_run(request, tmp_path_factory, service):
    """Per release: the service's advice as the advice file, the launcher with CAPWATCH_APPLY=on, then two ranks
    with the launcher's environment and resolved arguments."""
    release = request.param
    folder = tmp_path_factory.mktemp(f"apply-{release}")
    answer = service_advice(folder / "reporting", release, service)
    advice_file = folder / "advice.json"
    advice_file.write_text(json.dumps(trusted_raise(answer)))
    launched = launch(folder / "launcher", release, base_env(CAPWATCH_APPLY="on", CAPWATCH_ADVICE_FILE=str(advice_file),
                                                             CAPWATCH_APPLY_STATE_FILE=str(folder / "state.json")))
    inherited = {name: value for name, value in launched.environment.items() if name.startswith(("SGLANG_", "CAPWATCH_"))}
    ranks = RankRun(folder / "ranks", 2, inherited, sglang_release=release)
    ranks.start({**PLAN, "resolved_server_args": str(folder / "launcher" / "server_args.pkl")})
    ranks.wait_ready()
    codes = ranks.release()
    yield release, answer, launched, ranks, codes


def test_apply_sets_the_advised_cap_in_the_launcher_and_every_rank_builds_with_it(applied_run):
    release, answer, launched, ranks, codes = applied_run
    assert "error" not in launched.outcome, launched.outcome  # SGLang's own resolution and checks accepted it
    expected = max(ADVISED, answer["floor_cap"] or 0)
    [line] = launched.lines()
    assert f"capwatch: apply (CAPWATCH_APPLY=on): set {VARIABLE}={expected} from advice revision " in line, line
    applied = read_applied(VARIABLE, launched.environment)
    assert (applied.cap, applied.source) == (expected, "capwatch") and launched.environment[VARIABLE] == str(expected)
    assert codes == [0, 0], ranks.logs()
    for rank in range(2):
        record = ranks.record(rank)
        assert record["max_num_tokens"] == [expected, expected], (release, record["max_num_tokens"])
        assert read_applied(VARIABLE, record["cap_environment"]) == applied
        assert "capwatch: apply" not in ranks.log(rank)  # nothing is resolved, or set, in a scheduler
        # Each scheduler reports what its dispatchers were built with, and who set it (issue #32 item 4).
        assert f"; its cap: applied by capwatch at start (revision {applied.revision})" in ranks.log(rank), \
            ranks.log(rank)[-3000:]


def test_apply_dry_run_says_what_it_would_set_and_changes_nothing(tmp_path, applied_run):
    release, answer, _, _, _ = applied_run
    advice_file = tmp_path / "advice.json"
    advice_file.write_text(json.dumps(trusted_raise(answer)))
    launched = launch(tmp_path / "launcher", release, base_env(CAPWATCH_APPLY="dry-run",
                                                              CAPWATCH_ADVICE_FILE=str(advice_file)))
    [line] = launched.lines()
    assert f"would set {VARIABLE}={max(ADVISED, answer['floor_cap'] or 0)}" in line and "nothing changed" in line
    assert VARIABLE not in launched.environment and read_applied(VARIABLE, launched.environment) is None


def test_apply_refuses_advice_for_another_model_read_from_sglangs_model_config(tmp_path, applied_run):
    """The service's advice names the model its ranks reported; the launcher reads its own from SGLang's
    ``ModelConfig`` on every release: advice for a model with twice the experts is not applied."""
    release, answer, _, _, _ = applied_run
    assert (answer["hidden_size"], answer["num_experts"], answer["top_k"]) == tuple(MODEL[name] for name in (
        "hidden_size", "num_experts", "top_k"))
    advice_file = tmp_path / "advice.json"
    advice_file.write_text(json.dumps(trusted_raise(answer, num_experts=2 * MODEL["num_experts"])))
    launched = launch(tmp_path / "launcher", release, base_env(CAPWATCH_APPLY="on",
                                                              CAPWATCH_ADVICE_FILE=str(advice_file)))
    [line] = launched.lines()
    assert (f"not applied: the advice is for another deployment shape: model num_experts {2 * MODEL['num_experts']} "
            f"(this server's model: {MODEL['num_experts']})") in line, line
    assert VARIABLE not in launched.environment and "error" not in launched.outcome


@pytest.mark.parametrize("release", [NEWEST], ids=release_id)
def test_apply_on_keeps_the_operators_value_and_override_replaces_it_before_sglangs_check(tmp_path, service, release):
    """The operator's 16 is below SGLang's floor: with ``on`` it is kept (and SGLang's own check refuses the server,
    as without capwatch); ``override`` sets the advised cap before that check runs, which then passes."""
    answer = service_advice(tmp_path / "reporting", release, service)
    advice_file = tmp_path / "advice.json"
    advice_file.write_text(json.dumps(trusted_raise(answer)))
    env = base_env(CAPWATCH_ADVICE_FILE=str(advice_file), **{VARIABLE: "16"})
    kept = launch(tmp_path / "on", release, {**env, "CAPWATCH_APPLY": "on"})
    assert f"the operator set {VARIABLE}=16 (CAPWATCH_APPLY=override replaces it)" in kept.lines()[0]
    assert "error" in kept.outcome and VARIABLE in kept.outcome["error"]  # SGLang's own start-up check
    replaced = launch(tmp_path / "override", release, {**env, "CAPWATCH_APPLY": "override"})
    assert "error" not in replaced.outcome, replaced.outcome
    assert replaced.environment[VARIABLE] == str(ADVISED) and "replacing the operator's 16" in replaced.lines()[0]


@pytest.mark.parametrize("release", [NEWEST], ids=release_id)
def test_apply_with_the_service_unreachable_starts_after_a_bounded_wait_in_one_line(tmp_path, release):
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        launched = launch(tmp_path, release, base_env(CAPWATCH_APPLY="on", CAPWATCH_APPLY_WAIT_S="1",
                                                      CAPWATCH_SERVICE_URL=f"http://127.0.0.1:{listener.getsockname()[1]}"))
    finally:
        listener.close()
    [line] = launched.lines()
    assert "did not answer within 1 s" in line and f"{VARIABLE} stays unset" in line
    assert "error" not in launched.outcome  # the server's resolution went on: nothing blocked or failed it
    assert VARIABLE not in launched.environment


@pytest.mark.parametrize("release", [NEWEST], ids=release_id)
def test_apply_under_ray_is_refused_in_one_line(tmp_path, release):
    launched = launch(tmp_path, release, base_env(CAPWATCH_APPLY="on", CAPWATCH_ADVICE_FILE=str(tmp_path / "none")),
                      server_args={"use_ray": True})
    [line] = launched.lines()
    assert "refused under Ray (--use-ray)" in line and "nothing changed" in line
    assert VARIABLE not in launched.environment and read_applied(VARIABLE, launched.environment) is None


# DeepEP low-latency on CPU (deep_ep.Buffer the one stand-in): the prefill chunk, a floor term in low_latency mode,
# under DeepEP's 1024.
DEEPEP_VARIABLE = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
DEEPEP_PLAN = {"deepep_mode": "low_latency", "deepep_model": DEEPEP_MODEL}
DEEPEP_SERVER = {"chunked_prefill_size": 256}
OVER_RESERVE_BYTES = 3 << 30


@pytest.mark.parametrize("release", [RELEASES[0], NEWEST], ids=release_id)  # both ways in: HookRegistry, SGLang's API
def test_apply_deepep_raise_past_sglangs_reserve_lowers_mem_fraction_static_on_its_opt_in(tmp_path, release):
    """The floor from SGLang 0.5.22's own functions on this release's resolution (a dry-run launcher's); then the
    advised 512 whose buffer outgrows SGLang's 2 GiB reserve by 3 GiB: applied with the opt-in, SGLang's own
    resolved --mem-fraction-static lower by 3 GiB over the memory SGLang reads; DeepEP's dispatchers in two ranks
    given the launcher's environment are built with 512."""
    probe = launch(tmp_path / "probe", release, base_env(CAPWATCH_APPLY="dry-run"), "deepep", DEEPEP_SERVER,
                   **DEEPEP_PLAN)
    terms = probe.outcome["floor_terms"]
    floor = max(terms["decode_graph"], terms["prefill_graph"], terms["prefill_chunk"])
    answer = {
        "cluster": "apply", "role": "target", "action": "raise", "recommended_cap": 512, "target_cap": 500,
        "lower_bound": 400, "upper_bound": 600, "confidence": 0.9, "env": None, "a2a_backend": "deepep",
        "cap_variable": DEEPEP_VARIABLE, "current_cap": 128, "ep_size": 2, "workspace_bytes_per_rank_current": None,
        "workspace_bytes_group_current": None, "floor_cap": floor, "budget_cap": None, "sample_count": 500,
        "overflow_windows": 2, "history_s": 9e4, "covered_history_s": 9e4, "max_peak_runtime_tokens": 450,
        "predicted_overflow_rate_current": 0.01, "predicted_overflow_rate_recommended": 0.0,
        "workspace_bytes_per_rank_recommended": OVER_RESERVE_BYTES + (2 << 30), "workspace_bytes_group_recommended": None,
        "workspace_bytes_group_delta": None, "over_sglang_reserve_bytes_recommended": OVER_RESERVE_BYTES,
        **MODEL}  # the model the launcher's config.json describes
    advice_file = tmp_path / "advice.json"
    advice_file.write_text(json.dumps(trusted_raise(answer, cap=512)))
    env = base_env(CAPWATCH_APPLY="on", CAPWATCH_ADVICE_FILE=str(advice_file), CAPWATCH_APPLY_LOWER_MEM_FRACTION="1")
    launched = launch(tmp_path / "on", release, env, "deepep", DEEPEP_SERVER, **DEEPEP_PLAN)
    [line] = launched.lines()
    assert f"set {DEEPEP_VARIABLE}=512 from advice revision" in line, line
    assert "error" not in launched.outcome and launched.environment[DEEPEP_VARIABLE] == "512"
    before = probe.outcome["mem_fraction_static"]
    after = launched.outcome["mem_fraction_static"]
    assert f"--mem-fraction-static {before:g} -> {after:g}" in line
    assert 0 < before - after < 1  # lowered by 3 GiB over the machine's memory, as SGLang reads it
    inherited = {name: value for name, value in launched.environment.items() if name.startswith(("SGLANG_", "CAPWATCH_"))}
    ranks = RankRun(tmp_path / "ranks", 2, inherited, sglang_release=release, program="tests.sglang.deepep_rank_program")
    ranks.start({**DEEPEP_PLAN, "plugins": True, "layers": [1, 0], "steps": [{"tokens": [3, 5]}],
                 "resolved_server_args": str(tmp_path / "on" / "server_args.pkl")})
    ranks.wait_ready()
    assert ranks.release() == [0, 0], ranks.logs()
    assert [ranks.record(rank)["caps"] for rank in range(2)] == [[512], [512]]


@pytest.mark.parametrize("release", [NEWEST], ids=release_id)
def test_apply_after_an_overflow_at_the_applied_cap_a_later_start_waits_for_newer_advice(tmp_path, release):
    """Advice at the floor of a server with a 32-token prefill chunk is applied; a decode step of 40 tokens on one
    rank overflows it and the rank dies (SGLang's assert), recording the overflow in the state file; the next start
    with the same advice applies nothing, with newer advice it applies again."""
    server = {"chunked_prefill_size": 32}
    probe = launch(tmp_path / "probe", release, base_env(CAPWATCH_APPLY="dry-run"), server_args=server)
    terms = probe.outcome["floor_terms"]
    floor = max(terms.values())  # SGLang's own rule on this release: every term
    answer = {
        "cluster": "apply", "role": "target", "action": "lower", "recommended_cap": floor, "target_cap": floor,
        "lower_bound": floor, "upper_bound": 64, "confidence": 0.9, "env": None, "a2a_backend": "flashinfer",
        "cap_variable": VARIABLE, "current_cap": 4096, "ep_size": 2, "workspace_bytes_per_rank_current": None,
        "workspace_bytes_group_current": None, "floor_cap": floor, "budget_cap": None, "sample_count": 500,
        "overflow_windows": 0, "history_s": 9e4, "covered_history_s": 9e4, "max_peak_runtime_tokens": 20,
        "predicted_overflow_rate_current": 0.0, "predicted_overflow_rate_recommended": 0.0,
        "workspace_bytes_per_rank_recommended": None, "workspace_bytes_group_recommended": None,
        "workspace_bytes_group_delta": None, **MODEL}
    advice_file, state_file = tmp_path / "advice.json", tmp_path / "state" / "apply-state.json"
    advice_file.write_text(json.dumps(trusted_raise(answer, cap=floor, action="lower")))
    env = base_env(CAPWATCH_APPLY="on", CAPWATCH_ADVICE_FILE=str(advice_file), CAPWATCH_APPLY_STATE_FILE=str(state_file))
    first = launch(tmp_path / "first", release, env, server_args=server)
    assert first.environment[VARIABLE] == str(floor), first.lines()
    inherited = {name: value for name, value in first.environment.items() if name.startswith(("SGLANG_", "CAPWATCH_"))}
    ranks = RankRun(tmp_path / "ranks", 2, inherited, sglang_release=release)
    ranks.start({"target_layers": [0, 1], "steps": [{"dp_tokens": [5, 7]}, {"dp_tokens": [floor + 8, 3]}],
                 "resolved_server_args": str(tmp_path / "first" / "server_args.pkl")})
    assert all(code != 0 for code in ranks.wait_exit(START_TIMEOUT_S)), ranks.logs()
    assert any(f"capwatch: apply: overflow at the applied {VARIABLE}={floor}" in ranks.log(rank) for rank in range(2))
    assert state_file.exists(), ranks.logs()
    again = launch(tmp_path / "again", release, env, server_args=server)
    [line] = again.lines()
    assert f"overflowed at the applied cap {floor}" in line and VARIABLE not in again.environment
    # Generated after the overflow (a revision is a whole second: 2 s on, as a service's next answer would be).
    advice_file.write_text(json.dumps(trusted_raise(answer, cap=floor, action="lower", generated_unix_s=time.time() + 2)))
    newer = launch(tmp_path / "newer", release, env, server_args=server)
    assert newer.environment[VARIABLE] == str(floor), newer.lines()


@pytest.mark.parametrize("release", [NEWEST], ids=release_id)
def test_apply_asks_the_running_service_for_its_clusters_advice(tmp_path, service, release):
    """Without an advice file the launcher asks ``capwatch serve`` for its cluster's advice: seconds of two ranks'
    reports are not advice to apply, and the line says which guardrail held it back."""
    service_advice(tmp_path / "reporting", release, service)  # the service now knows cluster apply-0-5-23
    cluster = f"apply-{release.replace('.', '-')}"
    answer = json.loads(urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        f"{service.url}/v1/clusters/{cluster}/advice", timeout=10).read())
    launched = launch(tmp_path / "launcher", release, base_env(CAPWATCH_APPLY="on", CAPWATCH_SERVICE_URL=service.url,
                                                              CAPWATCH_CLUSTER=cluster))
    [line] = launched.lines()
    trusted_action = answer["action"] in ("raise", "lower", "hold")
    why = "says low confidence" if trusted_action else f"the advice's action is {answer['action']!r}"
    assert "not applied: " in line and why in line, (line, answer["action"], answer["low_confidence"])
    assert "error" not in launched.outcome and VARIABLE not in launched.environment


def test_apply_sets_a_cap_sglang_reads_raw_and_one_through_envs_on_the_newest_release(tmp_path):
    """Mooncake EP's cap is not in SGLang's ``envs`` (read raw by get_int_env_var): set_cap writes it to the
    environment the ranks inherit; FlashInfer's goes through ``envs`` (it failed with AttributeError before)."""
    program = (
        "import os\n"
        "from sglang.srt.environ import envs\n"
        "from capwatch.sglang_plugin.apply.launcher import set_cap\n"
        "from capwatch.sglang_engine.caps import CAPS\n"
        "for name, cap in (('mooncake', 384), ('flashinfer', 2560)):\n"
        "    variable = CAPS[name].variable\n"
        "    set_cap(envs, variable, cap)\n"
        "    print(name, hasattr(envs, variable), os.environ[variable])\n")
    result = launcher.run("-c", program, python=sglang_python(), path_first=release_path(NEWEST),
                          timeout_s=START_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["mooncake False 384", "flashinfer True 2560"]
