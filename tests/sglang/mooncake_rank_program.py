"""One SGLang 0.5.23 scheduler rank with ``--moe-a2a-backend mooncake``, as far as the MoE A2A goes: run by the
sglang venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first, ``publish``,
``configure_scheduler_process`` (where the capwatch plugin starts), ``initialize_moe_config()`` — then builds each
MoE layer's dispatcher with SGLang's own ``create_moe_dispatcher`` (a ``MaybeTboDeepEPDispatcher`` driving a
``MooncakeEPDispatcher``; its group the gloo world) and runs the plan's steps as the DeepEP program does
(``deepep_rank_program.py``: dispatch, an expert stand-in, combine). The one stand-in is Mooncake EP's ``Buffer``
(``mooncake_standin.py``); the active ranks a GPU would hold come from SGLang's elastic-EP state, all active.

    python -m tests.sglang.mooncake_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from tests.sglang.deepep_rank_program import _wait_for, build, step


def start_rank(plan: dict, rank: int):
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    from tests.sglang import mooncake_standin

    mooncake_standin.install()  # Mooncake EP importable, as on a GPU host: before the plugin checks it
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch
    import torch.distributed as dist
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_moe_layer
    from sglang.srt.layers.moe.token_dispatcher import deepep, mooncake
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="mooncake",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, deepep_mode="low_latency",
        **plan.get("server_args", {}))
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it
    moe_utils.initialize_moe_config()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    fused_moe_layer._get_deepep_comm_group = lambda a2a_backend: dist.group.WORLD
    active = torch.ones(world, dtype=torch.int32)  # on a GPU: torch.ones(..., device="cuda"), all ranks alive
    mooncake.ElasticEPStateManager = types.SimpleNamespace(
        instance=lambda: types.SimpleNamespace(active_ranks=active))
    return deepep, fused_moe_layer.create_moe_dispatcher


def main(run_dir: Path, rank: int) -> None:
    import torch

    from tests.sglang.mooncake_standin import Buffer

    plan = json.loads((run_dir / "plan.json").read_text())
    model, world = plan["deepep_model"], plan["world"]
    deepep, create_moe_dispatcher = start_rank(plan, rank)
    built = {layer_id: build(create_moe_dispatcher, model, world, layer_id) for layer_id in plan["layers"]}
    layers = [built[layer_id] for layer_id in sorted(built)]
    generator = torch.Generator().manual_seed(1000 + rank)
    record = {"steps": [], "buffers": []}

    def save() -> None:
        record["buffers"] = [buffer.num_ep_buffer_bytes for buffer in Buffer.built]
        torch.save(record, run_dir / f"rank-{rank}.pt")

    for planned in plan["steps"]:
        if planned.get("pause"):
            save()
            (run_dir / f"paused-{rank}").write_text("")
            _wait_for(run_dir / "resume")
            continue
        tokens = planned["tokens"][rank]
        for layer in layers:
            x = torch.randn(tokens, model["hidden_size"], generator=generator).to(torch.bfloat16)
            ids = torch.rand(tokens, model["num_experts"], generator=generator).topk(model["top_k"]).indices
            weights = torch.rand(tokens, model["top_k"], generator=generator)
            save()
            combined, received = step(deepep, layer, x, ids, weights, None)
            record["steps"].append({"x": x, "ids": ids, "weights": weights, "combined": combined,
                                    "received": received})
    save()
    (run_dir / f"ready-{rank}").write_text("")
    _wait_for(run_dir / "release")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
