"""One SGLang scheduler rank with ``--moe-a2a-backend mooncake`` or ``nixl`` (the plan's ``backend``), the backends
with DeepEP's low-latency API shape, as far as the MoE A2A goes: run by the sglang venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first, ``publish``,
``configure_scheduler_process`` (where the capwatch plugin starts), ``initialize_moe_config()`` — then builds each
MoE layer's dispatcher with SGLang's own ``create_moe_dispatcher`` (a ``MaybeTboDeepEPDispatcher`` driving a
``MooncakeEPDispatcher`` or ``NixlEPDispatcher``; its group the gloo world) and runs the plan's steps as the DeepEP
program does (``deepep_rank_program.py``: dispatch, an expert stand-in, combine). The one stand-in is the library's
``Buffer`` (``mooncake_standin.py``, ``nixl_standin.py``); what a GPU host gives it beyond that is in
``BACKENDS``.

    python -m tests.sglang.deepep_api_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from tests.sglang.deepep_rank_program import build, run_planned_steps, step


@dataclass(frozen=True)
class Backend:
    standin: str  # the library's stand-in module
    buffer_bytes: str  # the stand-in Buffer's attribute holding what it allocated

    def as_on_a_gpu_host(self, module, world: int) -> None:
        """What SGLang's dispatcher module finds on a GPU host beyond the library."""
        if module.__name__.endswith(".mooncake"):  # the active ranks, from SGLang's elastic-EP state: all alive
            import torch

            active = torch.ones(world, dtype=torch.int32)  # on a GPU: torch.ones(..., device="cuda")
            module.ElasticEPStateManager = types.SimpleNamespace(
                instance=lambda: types.SimpleNamespace(active_ranks=active))
        else:  # NIXL EP joins its peers through SGLang's TCP store on GPU hosts
            module.get_global_tcp_store = lambda: types.SimpleNamespace()


BACKENDS = {"mooncake": Backend("tests.sglang.mooncake_standin", "num_ep_buffer_bytes"),
            "nixl": Backend("tests.sglang.nixl_standin", "num_rdma_bytes")}


def start_rank(plan: dict, rank: int):
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world, name = plan["world"], plan["backend"]
    begin_scheduler_process(rank)
    importlib.import_module(BACKENDS[name].standin).install()  # importable, as on a GPU host: before the plugin
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch.distributed as dist
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_moe_layer
    from sglang.srt.layers.moe.token_dispatcher import deepep
    from sglang.srt.server_args import ServerArgs

    module = importlib.import_module(f"sglang.srt.layers.moe.token_dispatcher.{name}")
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend=name,
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, deepep_mode="low_latency",
        **plan.get("server_args", {}))
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it
    moe_utils.initialize_moe_config()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    fused_moe_layer._get_deepep_comm_group = lambda a2a_backend: dist.group.WORLD
    BACKENDS[name].as_on_a_gpu_host(module, world)
    return deepep, fused_moe_layer.create_moe_dispatcher


def main(run_dir: Path, rank: int) -> None:
    plan = json.loads((run_dir / "plan.json").read_text())
    model, world, backend = plan["deepep_model"], plan["world"], BACKENDS[plan["backend"]]
    buffer_class = importlib.import_module(backend.standin).Buffer
    deepep, create_moe_dispatcher = start_rank(plan, rank)
    built = {layer_id: build(create_moe_dispatcher, model, world, layer_id) for layer_id in plan["layers"]}
    record = {"steps": [], "buffers": []}

    def buffers() -> None:
        record["buffers"] = [getattr(buffer, backend.buffer_bytes) for buffer in buffer_class.built]

    run_planned_steps(run_dir, rank, plan, model, [built[layer_id] for layer_id in sorted(built)], 1000,
                      lambda layer, x, ids, weights, planned: dict(
                          zip(("combined", "received"), step(deepep, layer, x, ids, weights, None))), record, buffers)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
