"""One SGLang scheduler rank (any verified release) with ``--moe-a2a-backend pplx``, as far as the MoE A2A goes: run by the sglang
venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first, ``publish``,
``configure_scheduler_process`` (where the capwatch plugin starts), ``initialize_moe_config()`` — then builds each
MoE layer's dispatcher with SGLang's own ``create_moe_dispatcher`` (a ``MaybeTboDeepEPDispatcher`` driving a
``PplxDispatcher``; its group the gloo world) and runs the plan's steps: dispatch, an expert stand-in (2 x the
rows), combine. The one stand-in is ``pplx_kernels`` (``pplx_standin.py``); what SGLang's ``PplxAllToAllManager``
asks of the GPU around it — the current CUDA device, and the NCCL half of the ``cpu:gloo,cuda:nccl`` group it
registers for the intranode kernel — is answered as a GPU host would (this rank's index; the group on gloo alone).

    python -m tests.sglang.pplx_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.sglang.deepep_rank_program import build, run_planned_steps


def start_rank(plan: dict, rank: int):
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    from tests.sglang import pplx_standin

    pplx_standin.install()  # pplx-kernels importable, as on a GPU host: before SGLang's module and the plugin
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch
    import torch.distributed as dist
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_moe_layer
    from sglang.srt.layers.moe.token_dispatcher import pplx
    from sglang.srt.server_args import ServerArgs

    pplx_standin.install(pplx)  # the zygote imported SGLang's module before pplx-kernels existed

    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="pplx",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, deepep_mode="low_latency",
        moe_runner_backend="deep_gemm", deepep_dispatcher_output_dtype="bf16", **plan.get("server_args", {}))
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it
    moe_utils.initialize_moe_config()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    fused_moe_layer._get_deepep_comm_group = lambda a2a_backend: dist.group.WORLD
    torch.cuda.current_device = lambda: rank  # this rank's GPU
    new_group = dist.new_group

    def gloo_group(*args, backend=None, **kwargs):  # NCCL needs the GPU: the group's CPU half alone
        return new_group(*args, backend="gloo" if backend == "cpu:gloo,cuda:nccl" else backend, **kwargs)

    pplx.dist.new_group = gloo_group
    return pplx, fused_moe_layer.create_moe_dispatcher


def step(pplx, dispatcher, hidden_states, topk_ids, topk_weights):
    """One MoE layer's communication as SGLang runs it around the experts (2 x the rows here)."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    out = dispatcher.dispatch(hidden_states=hidden_states, topk_output=StandardTopKOutput(topk_weights, topk_ids, None))
    expert_output = out.hidden_states * 2
    combined = dispatcher.combine(combine_input=pplx.PplxCombineInput(expert_output, out.topk_ids, out.topk_weights))
    return combined, out.masked_m.clone()


def main(run_dir: Path, rank: int) -> None:
    from tests.sglang.pplx_standin import AllToAll

    plan = json.loads((run_dir / "plan.json").read_text())
    model, world = plan["deepep_model"], plan["world"]
    pplx, create_moe_dispatcher = start_rank(plan, rank)
    built = {layer_id: build(create_moe_dispatcher, model, world, layer_id) for layer_id in plan["layers"]}
    record = {"steps": [], "all_to_alls": []}

    def all_to_alls() -> None:
        record["all_to_alls"] = [dict(vars(each), _routes=None) for each in AllToAll.built]

    run_planned_steps(run_dir, rank, plan, model, [built[layer_id] for layer_id in sorted(built)], 1000,
                      lambda layer, x, ids, weights, planned: dict(
                          zip(("combined", "received"), step(pplx, layer, x, ids, weights))), record, all_to_alls)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
