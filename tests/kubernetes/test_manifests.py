"""The Kubernetes manifests (dashboards/kubernetes.py -> dashboards/kubernetes/*.yaml), checked offline: committed
as generated; core objects against Kubernetes' own schemas (kubernetes-validate ships them, strict: an unknown field
fails); the PodMonitors and the PrometheusRule against prometheus-operator's CRD schemas (crds/, v0.93.0); promtool
on the rules inside the PrometheusRule; the pieces agreeing with each other; the service's environment as the
manifest sets it, run for real, answering the probe and the scrape the way a cluster sends them."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import types
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from capwatch.backends import DEFAULT_BACKEND
from capwatch.dashboards import kubernetes
from capwatch.engines import ENGINES
from capwatch.sglang_engine.deployment import ServerExample
from capwatch.telemetry.ports import DEFAULT_BASE_PORT

from tests.dashboards.conftest import DASHBOARDS_DIR, GRAFANA_DIR, RULES_FILE
from tests.support.ports import free_port
from tests.support.service import ServiceProcess

CRDS = Path(__file__).parent / "crds"
KUBERNETES_VERSIONS = ("1.30.0", "1.34.0", "1.37.0")  # the oldest, a middle and the newest the package ships
CORE_KINDS = {"Deployment", "Service", "PersistentVolumeClaim", "ConfigMap"}
NAME_RULE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # RFC 1123 subdomain


def committed() -> dict[str, list[dict]]:
    return {path.name: [item for item in yaml.safe_load_all(path.read_text()) if item]
            for path in sorted(kubernetes.KUBERNETES_DIR.glob("*.yaml"))}


def every_object() -> list[tuple[str, dict]]:
    return [(file_name, item) for file_name, items in committed().items() for item in items]


def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the openAPIV3Schema of each vendored CRD's served versions."""
    schemas = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schemas[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = \
                    version["schema"]["openAPIV3Schema"]
    return schemas


def validator(schema: dict) -> jsonschema.Draft7Validator:
    """A structural schema as the API server applies it (a JSON Schema subset). The metaschema is not checked: one
    of the CRD's patterns starts ``^(?i)``, which Go's regexp accepts and Python's ``re`` refuses there."""
    return jsonschema.Draft7Validator(schema)


def by_kind(kind: str) -> list[dict]:
    return [item for _, item in every_object() if item["kind"] == kind]


def test_the_committed_manifests_are_what_the_generator_writes():
    assert kubernetes.stale_files() == []
    assert set(committed()) == set(kubernetes.MANIFESTS)


def test_each_engines_example_runs_the_server_its_home_states():
    """The example Deployment's server (name, image, command, port, what loads the plugin) is the engine's
    (``server_example`` in its home); the generator puts capwatch's environment and ports around it. An engine
    capwatch does not ship (no second one exists yet) gets its own server, unchanged."""
    assert {f"{engine.NAME}-deployment-example.yaml" for engine in ENGINES.values()} <= set(kubernetes.MANIFESTS)
    other = types.SimpleNamespace(NAME="other", server_example=lambda backend, args, gpus: ServerExample(
        app="other-x", component="other-example", container="other", image="other:1", command=("other-serve",),
        args=("--a2a", backend, *args, "--gpus", str(gpus)), http_port=8000,
        plugin_env=(("OTHER_PLUGINS", "capwatch"),)))
    [deployment] = kubernetes.engine_example(other)
    assert deployment["metadata"]["name"] == "other-x"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "other-example"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert (container["name"], container["image"], container["command"]) == ("other", "other:1", ["other-serve"])
    assert container["args"] == ["--a2a", DEFAULT_BACKEND.name, *DEFAULT_BACKEND.example_server_args, "--gpus",
                                 str(kubernetes.GPUS_PER_NODE)]
    assert container["env"][0] == {"name": "OTHER_PLUGINS", "value": "capwatch"}  # first: it loads the plugin
    assert {"name": "CAPWATCH_ENABLED", "value": "1"} in container["env"]
    assert container["ports"][0] == {"name": "http", "containerPort": 8000, "protocol": "TCP"}
    assert [port["containerPort"] for port in container["ports"][1:]] == [
        DEFAULT_BASE_PORT + gpu for gpu in range(kubernetes.GPUS_PER_NODE)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_pass_kubernetes_schemas(version):
    checked = 0
    for file_name, item in every_object():
        if item["kind"] in CORE_KINDS:
            kubernetes_validate.validate(item, version, strict=True)
            checked += 1
        assert NAME_RULE.fullmatch(item["metadata"]["name"]) and len(item["metadata"]["name"]) <= 63, file_name
    assert checked >= 6


def test_the_schema_check_can_fail():
    deployment = copy.deepcopy(by_kind("Deployment")[0])
    deployment["spec"]["replica"] = 1  # a typo: strict validation knows no such field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    deployment = copy.deepcopy(by_kind("Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_custom_resources_pass_the_prometheus_operator_crds():
    schemas = crd_schemas()
    custom = [item for _, item in every_object() if item["kind"] not in CORE_KINDS]
    assert {item["kind"] for item in custom} == {"PodMonitor", "PrometheusRule"}
    for item in custom:
        validator(schemas[(item["apiVersion"], item["kind"])]).validate(item)
    broken = copy.deepcopy(by_kind("PodMonitor")[0])
    broken["spec"]["podMetricsEndpoints"][0]["port"] = 9470  # the CRD wants a port's name here
    with pytest.raises(jsonschema.ValidationError):
        validator(schemas[("monitoring.coreos.com/v1", "PodMonitor")]).validate(broken)


def test_the_prometheus_rule_is_the_rule_file_and_promtool_passes_it(promtool, tmp_path):
    (rule,) = by_kind("PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    extracted = tmp_path / "rules" / "capwatch.rules.yml"
    extracted.parent.mkdir()
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    checked = subprocess.run([promtool, "check", "rules", str(extracted)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = []
    for path in sorted((DASHBOARDS_DIR / "rules" / "tests").glob("*.yml")):  # the unit tests, on the extracted rules
        copy_path = tmp_path / "rules" / "tests" / path.name
        copy_path.parent.mkdir(exist_ok=True)
        copy_path.write_text(path.read_text())
        tests.append(str(copy_path))
    tested = subprocess.run([promtool, "test", "rules", *tests], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert tested.returncode == 0 and tested.stdout.count("SUCCESS") == len(tests), tested.stdout + tested.stderr


def test_the_pod_monitor_scrapes_the_ports_the_sglang_pod_declares_under_the_alerts_job_names():
    ranks, service = sorted(by_kind("PodMonitor"), key=lambda item: item["metadata"]["name"])
    (example,) = [item for item in by_kind("Deployment") if item["metadata"]["name"] != kubernetes.NAME]
    pod = example["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ranks["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    scraped = [endpoint["port"] for endpoint in ranks["spec"]["podMetricsEndpoints"]]
    base = int(env["CAPWATCH_METRICS_BASE_PORT"])
    assert base == DEFAULT_BASE_PORT and [ports[name] for name in scraped] == [base + gpu for gpu in range(8)]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == len(scraped)  # one scheduler, one port per GPU
    assert env["CAPWATCH_METRICS_HOST"] == "0.0.0.0" and env["SGLANG_PLUGINS"] == "capwatch"
    assert env["CAPWATCH_ENABLED"] == "1"
    rules = RULES_FILE.read_text()
    for monitor, job in ((ranks, "capwatch-ranks"), (service, "capwatch-service")):
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert {"action": "replace", "targetLabel": "job", "replacement": job} in endpoint["relabelings"]
        assert f'up{{job="{job}"}}' in rules  # the alert that watches the job
    (deployment,) = [item for item in by_kind("Deployment") if item["metadata"]["name"] == kubernetes.NAME]
    service_pod = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"]["matchLabels"].items() <= service_pod.items()


def test_the_dashboards_config_maps_hold_the_committed_dashboards_for_grafanas_sidecar():
    maps = by_kind("ConfigMap")
    held = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        held.update(config_map["data"])
    assert held == {path.name: path.read_text() for path in GRAFANA_DIR.glob("*.json")}
    assert all(len(json.dumps(item)) < 1 << 20 for item in maps)  # a ConfigMap holds at most 1 MiB


def kubelet_environment(container: dict, fields: dict[str, str], secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: fieldRefs and secretKeyRefs resolved, $(VAR) of a
    variable defined before it expanded."""
    env: dict[str, str] = {}
    for item in container["env"]:
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            value = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            value = secrets[source["secretKeyRef"]["key"]]
        else:
            value = re.sub(r"\$\((\w+)\)", lambda match: env.get(match[1], match[0]), item["value"])
        env[item["name"]] = value
    return env


def test_the_service_runs_with_the_manifests_environment_and_answers_probe_and_scrape(tmp_path):
    """The manifest's environment on a real capwatch serve (the pod IP a loopback address here): the probe's Host
    (the pod IP and port) and the scrape's (the same) are answered; the Service's names are; another is not."""
    (deployment,) = [item for item in by_kind("Deployment") if item["metadata"]["name"] == kubernetes.NAME]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod_ip = "127.0.0.1"
    env = kubelet_environment(container, {"status.podIP": pod_ip, "metadata.namespace": "monitoring"},
                              {"token": "k8s-secret-token"})
    port = free_port()
    env.update(CAPWATCH_HOST="127.0.0.1", CAPWATCH_PORT=str(port), CAPWATCH_DB_PATH=str(tmp_path / "capwatch.db"))
    service = ServiceProcess(tmp_path / "capwatch.db", port=port, env=env).start(timeout_s=60)
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def status(path: str, host: str) -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
            try:
                with opener.open(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code

        probe = container["readinessProbe"]["httpGet"]
        assert status(probe["path"], f"10.244.3.9:{port}") == 200  # a probe from another pod IP too
        assert status("/metrics", f"{pod_ip}:{port}") == 200  # Prometheus scrapes the pod IP
        assert status("/v1/clusters", f"capwatch.monitoring.svc:{port}") == 200
        assert status("/v1/clusters", f"capwatch:{port}") == 200
        assert status("/v1/clusters", f"rebound.example:{port}") == 421
    finally:
        service.stop()
