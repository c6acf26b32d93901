"""One SGLang scheduler rank (0.5.22 or 0.5.23) with ``--moe-a2a-backend flashinfer_megamoe``, as far as the MoE layers
go: run by the sglang venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first, ``publish``,
``configure_scheduler_process`` (where the capwatch plugin starts) — then builds each MoE layer's MegaMoE layer with
SGLang's own ``ensure_fp4_moe_layer_for_flashinfer_megamoe`` (DeepGEMM's FP8 x FP4 kernel config, the path without
startup autotuning) and runs the plan's steps through SGLang's own ``run_flashinfer_megamoe`` with the forward the
layer holds (``layer._flashinfer_megamoe_forward``), as the quantisation's ``apply`` does. The stand-ins: FlashInfer's
``moe_ep`` (``flashinfer_megamoe_standin.py``), the FusedMoE layer's attributes SGLang reads (the model's weights and
geometry: building a quantised FusedMoE needs the GPU kernels) and ``torch.cuda.current_device`` (no GPU here).
SGLang's resolution of the backend runs, but for its two checks of the GPU host (an SM100 device, an FP4
checkpoint: the tiny model is bf16).

    python -m tests.sglang.flashinfer_megamoe_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from tests.sglang.deepep_rank_program import run_planned_steps


def start_rank(plan: dict, rank: int):
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    from tests.sglang import flashinfer_megamoe_standin

    flashinfer_megamoe_standin.install()  # FlashInfer's moe_ep importable, as on a GPU host: before the plugin checks
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch
    import torch.distributed as dist
    from sglang.srt import runtime_context
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.server_args import ServerArgs

    # SGLang's resolution of the backend runs as released, but for the two facts of a GPU host with an FP4
    # checkpoint: an SM100 device, and a quantisation the kernels take (the tiny model is bf16).
    moe_hook.is_sm100_supported = lambda *args, **kwargs: True
    moe_hook.validate_flashinfer_megamoe_model = lambda server_args: None
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="flashinfer_megamoe",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, **plan.get("server_args", {}))
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    torch.cuda.current_device = lambda: rank  # the GPU this rank would own
    group = types.SimpleNamespace(device_group=dist.group.WORLD)
    runtime_context.get_parallel = lambda parallel=runtime_context.get_parallel(): types.SimpleNamespace(
        moe_ep_group=group, **{name: getattr(parallel, name) for name in ("moe_ep_rank", "moe_ep_size")})


def build(model: dict, world: int, rank: int, layer_id: int):
    """SGLang's layer build for one MoE layer (weights: a GPU's, in shape only)."""
    import torch
    from sglang.srt.layers.moe import flashinfer_megamoe

    local = model["num_experts"] // world
    hidden, intermediate = model["hidden_size"], model["intermediate_size"]
    layer = types.SimpleNamespace(
        layer_id=layer_id, hidden_size=hidden, num_experts=model["num_experts"], top_k=model["top_k"],
        intermediate_size_per_partition=intermediate, moe_ep_size=world, moe_ep_rank=rank,
        moe_runner_config=types.SimpleNamespace(swiglu_limit=None, routed_scaling_factor=None),
        w13_weight=torch.zeros(local, 2 * intermediate, hidden // 2, dtype=torch.uint8),
        w2_weight=torch.zeros(local, hidden, intermediate // 2, dtype=torch.uint8),
        w13_weight_scale_inv=torch.ones(local, 2 * intermediate, hidden // 32),
        w2_weight_scale_inv=torch.ones(local, hidden, intermediate // 32))
    flashinfer_megamoe._init_flashinfer_megamoe_layer_state(layer)
    return layer, flashinfer_megamoe.ensure_fp4_moe_layer_for_flashinfer_megamoe(layer)


def step(layer, mega, x, ids, weights):
    """One MoE forward as SGLang's quantisation ``apply`` runs it: the layer's forward, read now."""
    from sglang.srt.layers.moe import flashinfer_megamoe
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    quant_info = flashinfer_megamoe.FlashInferMegaMoeQuantInfo(mega=mega,
                                                               mega_forward=layer._flashinfer_megamoe_forward)
    dispatch_output = StandardDispatchOutput(hidden_states=x, hidden_states_scale=None,
                                             topk_output=StandardTopKOutput(weights, ids, None))
    return flashinfer_megamoe.run_flashinfer_megamoe(dispatch_output, quant_info, layer.moe_runner_config).hidden_states


def main(run_dir: Path, rank: int) -> None:
    import torch

    from tests.sglang import flashinfer_megamoe_standin

    plan = json.loads((run_dir / "plan.json").read_text())
    model, world = plan["megamoe_model"], plan["world"]
    start_rank(plan, rank)
    built = {layer_id: build(model, world, rank, layer_id) for layer_id in plan["layers"]}
    layers = [built[layer_id] for layer_id in sorted(built)]
    record = {"steps": [], "caps": [int(mega._fleet_params.max_tokens_per_rank) for _, mega in layers]}

    def workspaces() -> None:
        record["workspaces"] = [sum(root.untyped_storage().nbytes() for root in workspace._sym_roots)
                                for workspace in flashinfer_megamoe_standin.ALLOCATED]

    run_planned_steps(run_dir, rank, plan, model, layers, 1000,
                      lambda layer_mega, x, ids, weights, planned: {
                          "output": step(*layer_mega, x, ids.to(torch.int32), weights)},
                      record, workspaces)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
