"""The plugin in real SGLang ranks of every verified release (0.5.19 - 0.5.23, each from its released
wheel with its FlashInfer pin, the release in each test id): loaded by load_plugins() through its entry
point, started by configure_scheduler_process, around real FlashinferDispatchers on 2 and 4 gloo ranks;
/metrics against the dispatched geometry, reports and advice from a real ``capwatch serve``, overflows
before the rank dies, outputs unchanged when the plugin stands aside, a newer release only on opt-in."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
import torch
from capwatch.dispatcher.counting import TRAFFIC_SAMPLE_STRIDE
from capwatch.sglang_plugin.hooks.flashinfer import ADAPTERS

from tests.sglang.ranks import MODEL, START_TIMEOUT_S, RankRun
from tests.sglang.releases import RELEASES
from tests.support.ports import free_port_block
from tests.support.service import ServiceProcess

CLUSTER = "sglang-e2e"
NAMESPACE_PADDING = 128  # SGLang's _WORKSPACE_NAMESPACE_ALIGNMENT: decode 0, speculative 1, SP prefill 2
DEFAULT_CAP = 4096  # SGLang's default rule on every release with the CPU defaults here
NEWEST = RELEASES[-1]
A2A_PREFILL = {"0.5.22"}  # sends extend (prefill) batches through the A2A: counted with the target role
SGLANG_FLOOR = {"0.5.22", "0.5.23"}  # have SGLang's own start-up floor functions


def release_id(release: str) -> str:
    return f"sglang-{release}"


def plan_for(release: str) -> dict:
    """Target layers built out of order (the lowest id leads), a draft layer, and what the release
    sends through the A2A beyond decode: SP prefill on 0.5.23, a whole prefill batch on 0.5.22."""
    steps = [{"dp_tokens": [3, 5]}, {"dp_tokens": [1, 0]}, {"dp_tokens": [6, 2], "draft": True}]
    plan = {"target_layers": [3, 1], "draft_layers": [7], "steps": steps}
    if release == "0.5.23":
        plan["sp_prefill_layers"] = [5]
        steps.append({"dp_tokens": [2, 2], "sp_prefill": True})
    if release in A2A_PREFILL:
        steps.append({"dp_tokens": [9, 4], "extend": True})
    steps.append({"dp_tokens": [7, 4]})
    return plan


PLAN = plan_for(NEWEST)


def _role_of(step: dict, release: str) -> str:
    if step.get("extend"):
        return "target" if release in A2A_PREFILL else "all-gather"  # all-gather: no A2A, nothing counted
    return "draft" if step.get("draft") else "sp_prefill" if step.get("sp_prefill") else "target"


def _layers(plan: dict, role: str) -> list[int]:
    """The role's layer ids, in the order the rank program runs them."""
    return plan.get({"target": "target_layers", "draft": "draft_layers", "sp_prefill": "sp_prefill_layers"}[role], [])


def _targets(ids: torch.Tensor, world: int) -> list[set[int]]:
    """The EP ranks each token goes to (contiguous expert blocks), once however many experts there."""
    per_rank = MODEL["num_experts"] // world
    return [{int(expert) // per_rank for expert in row} for row in ids]


def expected_geometry(run: RankRun, plan: dict) -> dict[tuple[int, str], dict]:
    """Per (rank, role): what the counters must say, from the plan and the ids each rank routed."""
    world = run.world
    records = [run.record(rank) for rank in range(world)]
    expected = {}
    cursors = [0] * world
    for step in plan["steps"]:
        role = _role_of(step, run.sglang_release)
        runtime_tokens = max(step["dp_tokens"])
        layer_ids = _layers(plan, role)
        # Model order: by layer id where the plugin learns it at construction; 0.5.22 learns it only from
        # create_moe_dispatcher, which these ranks do not call, so there the layers keep their adoption order.
        in_order = layer_ids if ADAPTERS[run.sglang_release].layer_id_at_create else sorted(layer_ids)
        for layer_id in layer_ids:
            # The traffic sample: every TRAFFIC_SAMPLE_STRIDE-th layer in model order, from the first (the leader).
            sampled = in_order.index(layer_id) % TRAFFIC_SAMPLE_STRIDE == 0
            targets = []
            for rank in range(world):
                targets.append(_targets(records[rank]["topk_ids"][cursors[rank]], world))
                cursors[rank] += 1
            for rank in range(world):
                entry = expected.setdefault((rank, role), {"dispatch_calls": 0, "steps": [], "sent": 0, "received": 0})
                entry["dispatch_calls"] += 1
                if sampled:
                    entry["sent"] += sum(len(t) for t in targets[rank])
                    entry["received"] += sum(rank in t for source in targets for t in source)
        for rank in range(world):
            expected[(rank, role)]["steps"].append(runtime_tokens)
    return expected


def value(metrics: dict, name: str, **labels) -> float:
    matches = [v for (n, ls), v in metrics.items() if n == name and all(dict(ls).get(k) == str(w) for k, w in labels.items())]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} samples"
    return matches[0]


def assert_metrics_match(run: RankRun, plan: dict, scraped: dict[int, dict], cluster: str) -> None:
    """Each rank's scraped /metrics against the geometry it dispatched, role by role."""
    workspace_size = run.record(0)["workspace_size"]
    for (rank, role), entry in expected_geometry(run, plan).items():
        metrics = scraped[rank]
        series = {"dispatcher": role, "ep_rank": rank, "ep_group": cluster}
        assert value(metrics, "moe_a2a_dispatch_calls_total", **series) == entry["dispatch_calls"]
        assert value(metrics, "moe_a2a_forward_steps_total", **series) == len(entry["steps"])
        assert value(metrics, "moe_a2a_tokens_sent_total", **series) == entry["sent"]
        assert value(metrics, "moe_a2a_tokens_received_total", **series) == entry["received"]
        assert value(metrics, "moe_a2a_runtime_tokens_max", **series) == max(entry["steps"])
        assert value(metrics, "moe_a2a_runtime_tokens_sum", **series) == sum(entry["steps"])
        assert value(metrics, "moe_a2a_runtime_tokens_bucket", le="64.0", **series) == len(entry["steps"])
        assert value(metrics, "moe_a2a_cap_tokens", **series) == DEFAULT_CAP
        # One workspace per namespace however many layers share it, with SGLang's namespace padding.
        namespace = {"target": 0, "draft": 1, "sp_prefill": 2}[role]
        assert value(metrics, "moe_a2a_workspace_allocated_bytes", **series) == \
            workspace_size + NAMESPACE_PADDING * namespace
        assert value(metrics, "moe_a2a_workspace_bytes", **series) == workspace_size
        overflows = [v for (n, ls), v in metrics.items() if n == "moe_a2a_overflow_events_total"]
        assert overflows and not any(overflows)
        assert value(metrics, "capwatch_sglang_plugin_info", state="enabled") == 1


def get_json(url: str):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service") / "capwatch.sqlite3").start(timeout_s=60)
    yield process
    process.stop()


def configured(tmp_path, world: int, env: dict | None = None, optimize: bool = False, release: str = NEWEST,
               extra_path=(), fork: bool = True) -> RankRun:
    base_port = free_port_block(world)  # rank r exports on base + r
    env = {"SGLANG_PLUGINS": "capwatch", "CAPWATCH_CLUSTER": CLUSTER, "CAPWATCH_METRICS_BASE_PORT": str(base_port),
           "CAPWATCH_REPORT_INTERVAL_S": "0.5", **(env or {})}
    return RankRun(tmp_path, world, env, optimize=optimize, metrics_base_port=base_port, sglang_release=release,
                   extra_path=tuple(extra_path), fork=fork)


def launch(tmp_path, world: int, plan: dict, **options) -> RankRun:
    return configured(tmp_path, world, **options).start(plan)


@pytest.fixture(scope="module", autouse=True)
def warm_zygotes(tmp_path_factory, newer_release):
    """The zygotes this module's ranks fork from (one per release, the not-enabled case's, the newer release's),
    importing side by side from the start: an import uses one core, and the machine has two."""
    folder = tmp_path_factory.mktemp("warm")
    for release in RELEASES:
        configured(folder, 2, release=release).warm()
    configured(folder, 2, env=DISABLED_CASES["not-enabled"][0]).warm()
    configured(folder, 2, env={"CAPWATCH_ALLOW_NEWER_SGLANG": "1"}, extra_path=newer_release).warm()


@pytest.fixture(scope="module", params=RELEASES, ids=release_id)
def enabled_run(request, tmp_path_factory, service):
    """Two ranks of one release with the plugin, reporting to the service: scraped while alive, then released."""
    release = request.param
    cluster = f"{CLUSTER}-{release.replace('.', '-')}"
    plan = plan_for(release)
    run = launch(tmp_path_factory.mktemp("enabled"), 2, plan, env={"CAPWATCH_SERVICE_URL": service.url,
                                                                   "CAPWATCH_CLUSTER": cluster}, release=release)
    run.wait_ready()
    scraped = {rank: run.metrics(rank) for rank in range(run.world)}
    codes = run.release()
    yield run, plan, cluster, scraped, codes


def test_each_rank_exports_the_dispatched_geometry_per_role(enabled_run):
    run, plan, cluster, scraped, codes = enabled_run
    assert codes == [0, 0], run.logs()
    assert_metrics_match(run, plan, scraped, cluster)
    for rank in range(run.world):  # every scheduler serves its own exporter: base port + its GPU index
        log = run.log(rank)
        assert f"capwatch: enabled on sglang {run.sglang_release} (flashinfer backend, GPU {rank}); /metrics on " \
               f"http://127.0.0.1:{run.metrics_base_port + rank}/metrics" in log, log[-3000:]


def test_reports_reach_the_service_and_advice_comes_back(enabled_run, service):
    run, plan, cluster, _, _ = enabled_run
    # sp_prefill reports are accepted too; the service's ?role= query knows target and draft only so far.
    for role in ("target", "draft"):
        view = get_json(f"{service.url}/v1/clusters/{cluster}?role={role}")
        assert view["ranks_reporting"] + sum(rank["final"] for rank in view["ranks"]) >= 2
        assert sorted(rank["ep_rank"] for rank in view["ranks"]) == [0, 1]
        assert all(rank["final"] for rank in view["ranks"])  # the shutdown report of each rank
        steps = [step for step in plan["steps"] if _role_of(step, run.sglang_release) == role]
        assert view["group_max_runtime_tokens"] == max(max(step["dp_tokens"]) for step in steps)
    advice = get_json(f"{service.url}/v1/clusters/{cluster}/advice")
    assert advice["current_cap"] == DEFAULT_CAP
    assert advice["ep_size"] == 2
    assert advice["reasons"]


def test_advice_floor_is_the_releases_own_rule(enabled_run, service):
    """0.5.22 on: the advisor's floor (advisor/floor.py, from RankConfig.sglang) is what SGLang's own
    ``_required_flashinfer_a2a_dispatch_tokens_per_rank`` says for this server. 0.5.19 - 0.5.21 have no such
    function: capwatch's computation of the rule, which leaves out the prefill chunk (their prefill goes
    through an all-gather): cross-checked against 0.5.22's own function run on this release's settings."""
    run, _, cluster, scraped, _ = enabled_run
    advice = get_json(f"{service.url}/v1/clusters/{cluster}/advice")
    rule = "sglang" if run.sglang_release in SGLANG_FLOOR else "capwatch"
    assert value(scraped[0], "moe_a2a_sglang_info", dispatcher="target", floor_rule=rule,
                 sglang_version=run.sglang_release) == 1
    floor = run.record(0)["floor"]
    if rule == "sglang":
        assert advice["floor_cap"] == floor["required"]
    else:  # SGLang 0.5.22's terms on this release's settings, the prefill chunk left out
        assert advice["floor_cap"] == (max(floor["decode_graph"], floor["prefill_graph"]) or None), floor
        assert floor["prefill_chunk"] > (advice["floor_cap"] or 0)  # what SGLang's own rule would have added


# A cap SGLang accepts at start-up (chunked prefill 32, no CUDA graphs on CPU), then a decode step
# whose largest DP rank brings 40 tokens: R = 40 > 32.
OVERFLOW_CAP = 32
OVERFLOW_PLAN = {
    "server_args": {"chunked_prefill_size": OVERFLOW_CAP},
    "target_layers": [0, 1],
    "steps": [{"dp_tokens": [5, 7]}, {"dp_tokens": [40, 3]}, {"dp_tokens": [1, 1]}],
}


# SGLang's own assert on every adapter (the oldest release it serves: the frame capwatch reads the overflow from is
# that of FlashinferDispatcher.dispatch, whose signature the adapter checks on each of its releases at start, so
# the others add a launch and no path), and capwatch's own error where asserts are gone (python -O).
OVERFLOW_CASES = [(adapter.releases[0], False) for adapter in dict.fromkeys(ADAPTERS.values())] + [(NEWEST, True)]


@pytest.mark.parametrize("release, optimize", OVERFLOW_CASES,
                         ids=[f"{release_id(r)}-{'python-O' if o else 'asserts'}" for r, o in OVERFLOW_CASES])
def test_an_overflow_is_counted_and_reported_before_the_rank_dies(tmp_path, service, release, optimize):
    cluster = f"overflow-{release.replace('.', '-')}-{'O' if optimize else 'plain'}"
    # python -O shares no zygote with the other runs: its ranks start fresh, which keeps that path tested too.
    run = launch(tmp_path, 2, OVERFLOW_PLAN, optimize=optimize, release=release, fork=not optimize, env={
        "CAPWATCH_CLUSTER": cluster, "CAPWATCH_SERVICE_URL": service.url, "CAPWATCH_REPORT_INTERVAL_S": "60",
        "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK": str(OVERFLOW_CAP)})
    codes = run.wait_exit(START_TIMEOUT_S)  # they start, dispatch, overflow and die
    assert all(code != 0 for code in codes), run.logs()
    for rank in range(run.world):
        log = run.log(rank)
        if optimize:  # SGLang's asserts are gone: capwatch's own error ends the rank
            assert "CapOverflowError" in log and "needs 40 tokens per rank" in log, log[-3000:]
        else:  # SGLang's own assert, as without capwatch
            assert "AssertionError: FlashInfer A2A runtime token geometry exceeds its fixed workspace" in log, log[-3000:]
        assert "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK=128" in log
    view = get_json(f"{service.url}/v1/clusters/{cluster}")
    assert view["cap"] == OVERFLOW_CAP
    assert view["group_max_runtime_tokens"] == 40
    for rank_view in view["ranks"]:
        assert rank_view["final"], view  # the final report arrived before the rank died
        assert rank_view["overflow_events"] == {"runtime_over_cap/raised": 1} or \
            sum(rank_view["overflow_events"].values()) == 1, rank_view
        assert rank_view["forward_steps_total"] == 2  # the overflowing step is in the histogram too


CAPTURE = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_cuda_graphs"
NEWER = "0.5.24"  # what a fake dist-info before the newest release's folder says it is
# case: (environment, plan extras, a newer version's dist-info, the disabled reason's words)
DISABLED_CASES = {
    "not-enabled": ({"SGLANG_PLUGINS": "some-other-plugin"}, {}, False, None),
    "bad-setting": ({"CAPWATCH_METRICS_BASE_PORT": "ninety"}, {}, False, None),
    # A function of SGLang's that the CPU ranks never call, gone as if a release had moved it.
    "moved-target": ({}, {"hide_hook_target": CAPTURE}, False, "cuda_graph_setup.capture_cuda_graphs is not there"),
    # Opted in, but a target of the newest adapter is gone in the newer release: still disabled.
    "newer-release-opted-in-moved-target": ({"CAPWATCH_ALLOW_NEWER_SGLANG": "1"}, {"hide_hook_target": CAPTURE},
                                            True, "cuda_graph_setup.capture_cuda_graphs is not there"),
}


@pytest.fixture(scope="module")
def newer_release(tmp_path_factory) -> list:
    """A folder whose sglang dist-info says 0.5.24, put before the newest release's own: its code, a newer
    version number, as a release whose hook targets still match the newest adapter. One for the module: its
    runs fork from one zygote (a zygote serves one PYTHONPATH)."""
    folder = tmp_path_factory.mktemp("newer")
    dist_info = folder / f"sglang-{NEWER}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {NEWER}\n")
    return [folder]


@pytest.mark.parametrize("enabled_run", [NEWEST], indirect=True, ids=release_id)
@pytest.mark.parametrize("case", sorted(DISABLED_CASES))
def test_without_the_plugin_outputs_are_identical(tmp_path, enabled_run, newer_release, case):
    enabled = enabled_run[0]
    env, extra_plan, newer, reason = DISABLED_CASES[case]
    run = launch(tmp_path, 2, {**PLAN, **extra_plan}, env=env, extra_path=newer_release if newer else ())
    run.wait_ready()
    if reason is not None:  # one log line and an info metric that says why
        metrics = run.metrics(0)
        reasons = [dict(labels)["reason"] for (name, labels), _ in metrics.items()
                   if name == "capwatch_sglang_plugin_info" and dict(labels)["state"] == "disabled"]
        assert reasons and reason in reasons[0], reasons
        assert not any(name.startswith("moe_a2a_") for name, _ in metrics)
    assert run.release() == [0, 0], run.logs()
    for rank in range(run.world):
        expected, got = enabled.record(rank)["outputs"], run.record(rank)["outputs"]
        assert len(got) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
        log = run.log(rank)
        disabled_lines = [line for line in log.splitlines() if "capwatch: disabled" in line]
        if case == "not-enabled":
            assert "Skipping plugin capwatch (not in SGLANG_PLUGINS)" in log and not disabled_lines
        else:
            assert len(disabled_lines) == 1, log[-3000:]


# What the plugin's entry point imports before it reads the kill switch (standard library besides).
IMPORTED_WHEN_OFF = {"capwatch", "capwatch.sglang_plugin", "capwatch.sglang_plugin.releases",
                     "capwatch.agent", "capwatch.agent.switch"}


@pytest.mark.parametrize("enabled_run", RELEASES, indirect=True, ids=release_id)
def test_the_kill_switch_leaves_sglang_as_shipped(tmp_path, enabled_run):
    """CAPWATCH_ENABLED=0 with SGLANG_PLUGINS empty (SGLang's default: it loads every installed plugin), on every
    release: SGLang loads the entry point, which hooks nothing, imports nothing else of capwatch's and binds no
    port; the outputs are the instrumented run's; one line per scheduler says so."""
    enabled = enabled_run[0]
    release = enabled.sglang_release
    run = launch(tmp_path, 2, plan_for(release), env={"SGLANG_PLUGINS": "", "CAPWATCH_ENABLED": "0"},
                 release=release)
    run.wait_ready()
    for rank in range(run.world):
        with pytest.raises(OSError):  # nothing listens on the rank's exporter port
            run.metrics(rank)
    assert run.release() == [0, 0], run.logs()
    for rank in range(run.world):
        expected, got = enabled.record(rank), run.record(rank)
        assert len(got["outputs"]) == len(expected["outputs"])
        assert all(torch.equal(a, b) for a, b in zip(expected["outputs"], got["outputs"]))
        assert "capwatch" in expected["hook_plugins"] and "capwatch" not in got["hook_plugins"]
        plugin_modules = {name for name in got["capwatch_modules"]  # the stand-in imports capwatch's dispatcher
                          if name.startswith(("capwatch.sglang_plugin", "capwatch.telemetry"))}
        assert plugin_modules <= IMPORTED_WHEN_OFF and "capwatch.sglang_plugin.plugin" in expected["capwatch_modules"], \
            got["capwatch_modules"]
        log = run.log(rank)
        assert "Loaded plugin capwatch" in log and "Executed general plugin: capwatch" in log, log[-3000:]
        lines = [line for line in log.splitlines() if "capwatch:" in line]
        assert len(lines) == 1 and "capwatch: off (CAPWATCH_ENABLED=0): nothing hooked, no port bound" in lines[0], \
            log[-3000:]


def test_a_taken_port_is_one_line_and_sglang_runs_on(tmp_path):
    """Another process (dcgm-exporter, another server) holds rank 0's exporter port: that scheduler says so in
    one line, without a traceback, and runs as without the plugin; rank 1's port is free and it is instrumented."""
    run = configured(tmp_path, 2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", run.metrics_base_port))
        holder.listen()
        run.start(PLAN)
        run.wait_ready()
        assert value(run.metrics(1), "capwatch_sglang_plugin_info", state="enabled") == 1
        assert run.release() == [0, 0], run.logs()
    log = run.log(0)
    lines = [line for line in log.splitlines() if "capwatch:" in line]
    assert len(lines) == 1 and f"capwatch: disabled: cannot serve /metrics on 127.0.0.1:{run.metrics_base_port} " \
        f"(Address already in use)" in lines[0] and "CAPWATCH_METRICS_BASE_PORT" in lines[0], log[-3000:]
    assert "Traceback" not in log


def test_a_newer_release_runs_on_four_ranks_on_the_newest_adapters_when_the_operator_opts_in(tmp_path, newer_release):
    """CAPWATCH_ALLOW_NEWER_SGLANG=1 and every hook target and signature of the newest adapter matches:
    instrumented, and the one log line says on what. On four ranks (one launch for both): each counts the
    geometry it dispatched and serves its own exporter."""
    plan = {"target_layers": [0, 1], "steps": [{"dp_tokens": [3, 0, 9, 4]}, {"dp_tokens": [1, 1, 1, 2]},
                                               {"dp_tokens": [0, 0, 0, 0]}, {"dp_tokens": [12, 5, 5, 5]}]}
    run = launch(tmp_path, 4, plan, env={"CAPWATCH_ALLOW_NEWER_SGLANG": "1"}, extra_path=newer_release)
    run.wait_ready()
    scraped = {rank: run.metrics(rank) for rank in range(run.world)}
    assert run.release() == [0, 0, 0, 0], run.logs()
    assert_metrics_match(run, plan, scraped, CLUSTER)
    lines = [line for line in run.log(0).splitlines() if "capwatch: enabled" in line]
    assert len(lines) == 1 and f"sglang {NEWER}, newer than the verified 0.5.19 - {NEWEST}, on the {NEWEST} adapters" \
        in lines[0] and "every hook target and signature matched" in lines[0], lines
