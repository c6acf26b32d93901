"""Kubernetes manifests for capwatch, from the same code and files as the dashboards and rules.

``render_all()`` -> {file name: YAML}: the service (Deployment, its database's volume, Service), PodMonitors for
the SGLang pods' exporter ports and for the service, an SGLang Deployment example with the plugin's environment,
the alert and recording rules as a ``PrometheusRule``, and the dashboards as ConfigMaps for Grafana's sidecar.
Committed under ``dashboards/kubernetes/`` and shipped in the package (``capwatch dashboards export DIR`` writes
them); the tests check them against Kubernetes' schemas and the prometheus-operator CRDs, offline.

Deliberate choices:
- One service replica, ``Recreate``: SQLite has one writer, and a ``ReadWriteOnce`` volume one node.
- ``CAPWATCH_ALLOWED_HOSTS`` names the Service (short and qualified) and the pod's own IP, which is what
  Prometheus' scrape sends as Host; the probes need none of it (``/healthz`` answers any well-formed Host).
- The token comes from the Secret ``capwatch-token`` (key ``token``), made by the operator, never a manifest.
- The ranks' exporters listen on the pod IP (``CAPWATCH_METRICS_HOST=0.0.0.0``): loopback cannot be scraped.
- Job names ``capwatch-ranks`` and ``capwatch-service``, as the alerts expect (``dashboards/prometheus.yml``).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import yaml

from capwatch.backends import DEFAULT_BACKEND
from capwatch.engines import ENGINES
from capwatch.telemetry.ports import DEFAULT_BASE_PORT
from capwatch.version import capwatch_version

KUBERNETES_DIR = Path(__file__).resolve().parent / "kubernetes"
RULES_FILE = Path(__file__).resolve().parent / "rules" / "capwatch.rules.yml"
GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"  # the committed JSON (the tests keep it current)

NAME = "capwatch"
SERVICE_PORT = 8321
DATA_DIR = "/var/lib/capwatch"
TOKEN_SECRET = {"name": "capwatch-token", "key": "token"}
RANK_JOB, SERVICE_JOB = "capwatch-ranks", "capwatch-service"
GPUS_PER_NODE = 8  # one scheduler per GPU: one exporter port each (base + GPU index)
# kube-prometheus-stack's Prometheus selects PodMonitors and PrometheusRules by this label (its Helm release).
PROMETHEUS_SELECTOR = {"release": "kube-prometheus-stack"}
# kube-prometheus-stack's Grafana sidecar loads every ConfigMap with this label as dashboards.
GRAFANA_SIDECAR_LABEL = {"grafana_dashboard": "1"}
INSTRUMENTED_LABEL = {"capwatch-scrape": "true"}  # the SGLang pods whose exporters the PodMonitor scrapes


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": NAME}


def _meta(name: str, component: str, extra: dict | None = None, annotations: dict | None = None) -> dict:
    meta = {"name": name, "labels": {**labels(component), **(extra or {})}}
    if annotations:
        meta["annotations"] = annotations
    return meta


def _env(name: str, value: str) -> dict:
    return {"name": name, "value": value}


def _field(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _token() -> dict:
    return {"name": "CAPWATCH_TOKEN", "valueFrom": {"secretKeyRef": dict(TOKEN_SECRET)}}


def image() -> str:
    return f"a2a-capwatch:{capwatch_version()}"  # built as docs/kubernetes.md says: no public image is published


RESTRICTED = {  # the Pod Security Standards' "restricted" profile
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}


def service_objects() -> list[dict]:
    """The service: the database's volume, one Deployment, its Service."""
    component = "service"
    selector = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": component}
    allowed_hosts = [NAME, f"{NAME}.$(POD_NAMESPACE)", f"{NAME}.$(POD_NAMESPACE).svc",
                     f"{NAME}.$(POD_NAMESPACE).svc.cluster.local", "$(POD_IP)", "127.0.0.1", "localhost"]
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "capwatch", "image": image(), "imagePullPolicy": "IfNotPresent",
        "command": ["capwatch", "serve"],
        "ports": [{"name": "http", "containerPort": SERVICE_PORT, "protocol": "TCP"}],
        "env": [
            _field("POD_IP", "status.podIP"), _field("POD_NAMESPACE", "metadata.namespace"),
            _env("CAPWATCH_HOST", "0.0.0.0"), _env("CAPWATCH_PORT", str(SERVICE_PORT)),
            _env("CAPWATCH_DB_PATH", f"{DATA_DIR}/capwatch.db"), _token(),
            # Kubernetes expands $(POD_IP) and $(POD_NAMESPACE), defined above, into the list.
            _env("CAPWATCH_ALLOWED_HOSTS", json.dumps(allowed_hosts)),
        ],
        "startupProbe": {**probe, "failureThreshold": 30},  # a large database's integrity check at start
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": RESTRICTED,
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    volume_claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(f"{NAME}-data", component),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME, component),
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels(component)}},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                        "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 30,  # the writer drains: every acknowledged report is kept
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"{NAME}-data"}},
                                {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(NAME, component),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http",
                                                  "protocol": "TCP"}]},
    }
    return [volume_claim, deployment, service]


def rank_port_name(gpu: int) -> str:
    return f"capwatch-{gpu}"


def _job(name: str) -> list[dict]:
    """Relabel the job to the name the alerts watch (prometheus-operator's default is namespace/monitor)."""
    return [{"action": "replace", "targetLabel": "job", "replacement": name}]


def pod_monitors() -> list[dict]:
    """One for the SGLang pods' exporters (a port per GPU), one for the service."""
    ranks = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": _meta(RANK_JOB, "ranks", PROMETHEUS_SELECTOR),
        "spec": {
            "selector": {"matchLabels": dict(INSTRUMENTED_LABEL)},
            "podMetricsEndpoints": [{"port": rank_port_name(gpu), "path": "/metrics", "interval": "15s",
                                     "relabelings": _job(RANK_JOB)} for gpu in range(GPUS_PER_NODE)],
        },
    }
    service = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": _meta(SERVICE_JOB, "service", PROMETHEUS_SELECTOR),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "service"}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "30s",
                                     "relabelings": _job(SERVICE_JOB)}],
        },
    }
    return [ranks, service]


def engine_example(engine) -> list[dict]:
    """A server of ``engine`` (``capwatch.engines``) with the plugin on a plain Deployment (one node, 8 GPUs, EP 8):
    the environment and the ports a pod needs; the server itself is the engine's (its ``server_example``)."""
    server = engine.server_example(DEFAULT_BACKEND.name, DEFAULT_BACKEND.example_server_args, GPUS_PER_NODE)
    env = [
        *(_env(name, value) for name, value in server.plugin_env),
        _env("CAPWATCH_ENABLED", "1"),  # the kill switch: "0" and a restart roll it back
        _env("CAPWATCH_CLUSTER", "deepseek-v3-prod"),  # the EP group's name: its ep_group label and the service's
        _env("CAPWATCH_SERVICE_URL", f"http://{NAME}:{SERVICE_PORT}"), _token(),
        _env("CAPWATCH_METRICS_HOST", "0.0.0.0"), _env("CAPWATCH_METRICS_BASE_PORT", str(DEFAULT_BASE_PORT)),
        _env(DEFAULT_BACKEND.rules.cap_env_var, "1024"),
    ]
    ports = [{"name": "http", "containerPort": server.http_port, "protocol": "TCP"}] + [
        {"name": rank_port_name(gpu), "containerPort": DEFAULT_BASE_PORT + gpu, "protocol": "TCP"}
        for gpu in range(GPUS_PER_NODE)]
    selector = {"app.kubernetes.io/name": server.app}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": server.app, "labels": {**selector, "app.kubernetes.io/component": server.component}},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**selector, **INSTRUMENTED_LABEL}},
                "spec": {"containers": [{
                    "name": server.container, "image": server.image, "command": list(server.command),
                    "args": list(server.args), "env": env, "ports": ports,
                    "resources": {"limits": {"nvidia.com/gpu": GPUS_PER_NODE}},
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                }], "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}]},
            },
        },
    }
    return [deployment]


def prometheus_rule() -> list[dict]:
    """The rule file as a PrometheusRule: the same groups, word for word."""
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [{"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
             "metadata": _meta(NAME, "rules", PROMETHEUS_SELECTOR), "spec": {"groups": groups}}]


def dashboard_config_maps() -> list[dict]:
    """Each dashboard in a ConfigMap Grafana's sidecar loads (its label; the folder by annotation)."""
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": _meta(f"{NAME}-dashboard-{path.stem}", "dashboards",
                               GRAFANA_SIDECAR_LABEL, {"grafana_folder": NAME}),
             "data": {path.name: path.read_text()}} for path in sorted(GRAFANA_DIR.glob("*.json"))]


MANIFESTS = {
    "capwatch-service.yaml": service_objects,
    "capwatch-podmonitors.yaml": pod_monitors,
    "capwatch-prometheusrule.yaml": prometheus_rule,
    "capwatch-dashboards.yaml": dashboard_config_maps,
    # Each engine's example server (today SGLang's: sglang-deployment-example.yaml).
    **{f"{engine.NAME}-deployment-example.yaml": partial(engine_example, engine) for engine in ENGINES.values()},
}


class _Literal(str):
    """A multi-line string written as a YAML block (the dashboards' JSON, the rules' expressions)."""


def _literal(dumper: yaml.SafeDumper, text: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")


def _blocks(value):
    if isinstance(value, dict):
        return {key: _blocks(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_blocks(item) for item in value]
    if isinstance(value, str) and "\n" in value and not any(line != line.rstrip() for line in value.splitlines()):
        return _Literal(value)
    return value


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def render(objects: list[dict]) -> str:
    header = "# Generated by python -m capwatch.dashboards.kubernetes (dashboards/kubernetes.py): do not edit.\n"
    return header + "".join("---\n" + yaml.dump(_blocks(item), Dumper=_Dumper, sort_keys=False, width=120)
                            for item in objects)


def render_all() -> dict[str, str]:
    return {file_name: render(build()) for file_name, build in MANIFESTS.items()}


def stale_files(directory: Path = KUBERNETES_DIR) -> list[str]:
    return [name for name, text in render_all().items()
            if not (directory / name).is_file() or (directory / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    """``python -m capwatch.dashboards.kubernetes [--check]``: regenerate (or check) dashboards/kubernetes/."""
    import sys

    if argv is None:
        argv = sys.argv[1:]
    if argv == ["--check"]:
        stale = stale_files()
        for name in stale:
            print(f"stale: {KUBERNETES_DIR / name} (run python -m capwatch.dashboards.kubernetes)", file=sys.stderr)
        return 1 if stale else 0
    KUBERNETES_DIR.mkdir(exist_ok=True)
    for name, text in render_all().items():
        (KUBERNETES_DIR / name).write_text(text)
        print(KUBERNETES_DIR / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
