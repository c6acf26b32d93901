"""Answer size queries with a sgl-deep-ep wheel's compiled extension (run by the sglang venv's python).

    python -m tests.sizing.deepep_runner PATH/TO/deep_ep [MODEL_DIR] < queries.json > answers.json

Queries, answered in order:

- ``["ll", T, hidden, ranks, experts]``: ``get_low_latency_rdma_size_hint``;
- ``["nvl" | "rdma", num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv, hidden_bytes, ranks]``:
  ``Config(...).get_nvl_buffer_size_hint`` / ``get_rdma_buffer_size_hint``;
- ``["sglang", mode, ranks, T, hidden, experts, qp_depth_env]``: what SGLang's own
  ``DeepEPBuffer.get_deepep_buffer`` passes to ``deep_ep.Buffer``, ``[num_nvl_bytes, num_rdma_bytes,
  NVSHMEM_QP_DEPTH]`` (needs MODEL_DIR, a model config SGLang's ``ServerArgs`` can read).

A query DeepEP refuses (its ``EP_HOST_ASSERT`` raises) answers null. The extension is loaded alone, not
through ``deep_ep/__init__.py`` (whose NCCL check and JIT set-up need a GPU; see ``deepep_source.py``). For
the SGLang queries the wheel's own ``deep_ep/buffers/legacy.py`` ``Buffer`` serves SGLang, its statics and
``Config`` the compiled ones; only its constructor, which registers GPU memory, records its arguments.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

ANSWERS_MARK = "deepep-answers: "


def load_extension(package: Path):
    import torch  # noqa: F401  (the extension needs torch's symbols loaded first)

    path = next(package.glob("_C*.so"))
    loader = importlib.machinery.ExtensionFileLoader("deep_ep._C", str(path))
    spec = importlib.util.spec_from_file_location("deep_ep._C", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def hint(extension, query: list):
    kind, *arguments = query
    try:
        if kind == "ll":
            return extension.get_low_latency_rdma_size_hint(*arguments)
        config = extension.Config(*arguments[:5])
        size = config.get_nvl_buffer_size_hint if kind == "nvl" else config.get_rdma_buffer_size_hint
        return size(*arguments[5:])
    except RuntimeError:  # EP_HOST_ASSERT
        return None


class SGLangBuffer:
    """SGLang 0.5.23's ``DeepEPBuffer`` over the wheel's ``deep_ep.Buffer``, on CPU."""

    def __init__(self, package: Path, extension, model_dir: Path):
        deep_ep = types.ModuleType("deep_ep")
        deep_ep.__path__ = [str(package)]
        sys.modules["deep_ep"], sys.modules["deep_ep._C"] = deep_ep, extension
        from deep_ep.buffers import legacy

        self.made: list[tuple[int, int]] = []

        def record(buffer, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, **_options):
            self.made.append((num_nvl_bytes, num_rdma_bytes))
            buffer.group_size, buffer.low_latency_mode = group.size(), low_latency_mode

        legacy.Buffer.__init__ = record
        deep_ep.Buffer, deep_ep.Config = legacy.Buffer, extension.Config

        import torch
        from sglang.srt.runtime_context import SpawnRanks, get_resources, publish
        from sglang.srt.server_args import ServerArgs

        publish(ServerArgs(model_path=str(model_dir), skip_tokenizer_init=True, device="cpu", moe_a2a_backend="deepep",
                           tp_size=8, ep_size=8), role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        from sglang.srt.layers.moe.token_dispatcher import deepep
        from sglang.srt.layers.moe.utils import DeepEPMode

        assert deepep.use_deepep, deepep._deepep_import_error
        # The two device queries of get_deepep_buffer (an SM count for a warning, MNNVL support) have no CPU answer.
        torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(multi_processor_count=132)
        deepep._is_mnnvl_fabric_supported = lambda: False
        self.module, self.mode, self.resources = deepep, DeepEPMode, get_resources

    def allocate(self, mode: str, ranks: int, cap: int, hidden: int, experts: int, qp_depth_env: int | None):
        self.resources().buffers.pop("deepep_ep_state", None)  # one buffer per process: a fresh process each time
        os.environ.pop("NVSHMEM_QP_DEPTH", None)
        if qp_depth_env is not None:
            os.environ["NVSHMEM_QP_DEPTH"] = str(qp_depth_env)
        group = types.SimpleNamespace(size=lambda: ranks)
        self.module.DeepEPBuffer.get_deepep_buffer(group, hidden, 2, self.mode(mode), cap, experts)
        return [*self.made[-1], int(os.environ["NVSHMEM_QP_DEPTH"])]


def main() -> None:
    package = Path(sys.argv[1])
    extension = load_extension(package)
    queries = json.load(sys.stdin)
    sglang = SGLangBuffer(package, extension, Path(sys.argv[2])) if any(q[0] == "sglang" for q in queries) else None
    answers = [sglang.allocate(*query[1:]) if query[0] == "sglang" else hint(extension, query) for query in queries]
    print(ANSWERS_MARK + json.dumps(answers))  # SGLang may print to stdout too: the answers are marked


if __name__ == "__main__":
    main()
