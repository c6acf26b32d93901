"""The SGLang server of the Kubernetes example (``dashboards/kubernetes.py`` builds the Deployment around it,
with capwatch's own environment and ports): its name, image, command line and what makes it load the plugin."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerExample:
    """An engine's server as the example Deployment runs it (one node, EP over its GPUs)."""

    app: str  # the Deployment's and its pods' app.kubernetes.io/name
    component: str  # the Deployment's app.kubernetes.io/component
    container: str
    image: str  # must hold the engine and a2a-capwatch[sglang] (docs/kubernetes.md)
    command: tuple[str, ...]
    args: tuple[str, ...]
    http_port: int  # the server's API
    plugin_env: tuple[tuple[str, str], ...]  # first in the container's environment: what loads capwatch's plugin


def server_example(a2a_backend: str, backend_args: Sequence[str], gpus: int) -> ServerExample:
    """DeepSeek-V3 on one node: TP, EP and DP attention over its ``gpus``, the A2A ``a2a_backend`` with the
    server arguments its example needs (``BackendSpec.example_server_args``)."""
    http_port = 30000
    return ServerExample(
        app="sglang-deepseek-v3", component="sglang-example", container="sglang", image="sglang-with-capwatch:latest",
        command=("python3",),
        args=("-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3", "--tp", str(gpus),
              "--ep", str(gpus), "--dp", str(gpus), "--enable-dp-attention", "--moe-a2a-backend", a2a_backend,
              *backend_args, "--host", "0.0.0.0", "--port", str(http_port)),
        http_port=http_port,
        # an allowlist: only capwatch; empty would load every installed plugin
        plugin_env=(("SGLANG_PLUGINS", "capwatch"),),
    )
