"""One SGLang scheduler rank with ``--moe-a2a-backend mori``, as far as the MoE A2A goes: run by the sglang venv's
python.

Does what ``run_scheduler_process`` does before the model is built (``load_plugins()`` first when the plan asks,
``publish``, ``configure_scheduler_process`` with the plugin, ``initialize_moe_config()``), then builds each MoE
layer's dispatcher with SGLang's own ``create_moe_dispatcher`` (a ``MaybeTboDeepEPDispatcher`` around a
``MoriEPDispatcher``; SGLang resolves ``--deepep-mode auto`` to normal for MoRI) and runs the plan's steps:
dispatch, an expert stand-in (2 x each row times the weights of this rank's experts), combine. SGLang's TP group
is the gloo world here. The stand-ins are ``mori`` and aiter's quantizer lookup (``mori_standin.py``).

A ``pause`` step writes the record and ``paused-<r>`` and waits for ``resume``. Writes ``rank-<r>.pt`` (every
combine output with its input and routing, the ops built, the over-cap batches MoRI saw) to the run folder, then
``ready-<r>`` and waits for ``release``. A dispatch refused (capwatch's guard) ends the rank with its error.

    python -m tests.sglang.mori_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from tests.sglang.deepep_rank_program import build, run_planned_steps


class _Group:
    """What MoRI's dispatcher reads of SGLang's GroupCoordinator."""

    def __init__(self, process_group):
        self.cpu_group = self.device_group = process_group


def start_rank(plan: dict, rank: int):
    """Publish a MoRI server's args, join the gloo group, and return SGLang's dispatcher module and factory."""
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    from tests.sglang import mori_standin

    mori_standin.install()  # `import mori` works, as on a ROCm server
    if plan.get("plugins"):
        from sglang.srt.plugins import load_plugins

        load_plugins()  # first thing, as in run_scheduler_process

    import torch
    import torch.distributed as dist
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_moe_layer
    from sglang.srt.layers.moe.token_dispatcher import moriep
    from sglang.srt.server_args import ServerArgs

    mori_standin.install_aiter(moriep)
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="mori",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, deepep_mode="auto",
        chunked_prefill_size=plan["chunked_prefill_size"], **plan.get("server_args", {}))
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it, with the GPU index
    moe_utils.initialize_moe_config()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    # SGLang hands MoRI its TP GroupCoordinator (cpu_group registered for MoRI's heap; a key of init_mori_op's
    # cache): the gloo world here.
    group = _Group(dist.group.WORLD)
    fused_moe_layer._get_deepep_comm_group = lambda a2a_backend: group
    # init_mori_op's CU count for the intranode grid has no CPU answer.
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(multi_processor_count=304)
    moriep._should_record_expert_distribution = lambda: False  # the recorder's capture probe has no CPU answer
    return moriep, fused_moe_layer.create_moe_dispatcher, torch


def step(moriep, dispatcher, hidden_states, topk_ids, topk_weights, rank: int, local_experts: int):
    """One MoE layer's communication as SGLang runs it around the experts."""
    import torch
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    out = dispatcher.dispatch(hidden_states=hidden_states,
                              topk_output=StandardTopKOutput(topk_weights, topk_ids, None))
    mine = (out.topk_ids // local_experts == rank) & (out.topk_ids >= 0)
    weight = (out.topk_weights * mine).sum(1, keepdim=True)
    expert_output = (out.hidden_states.float() * 2 * weight).to(hidden_states.dtype)
    combined = dispatcher.combine(combine_input=moriep.MoriEPNormalCombineInput(expert_output, out.topk_ids,
                                                                                out.topk_weights))
    return combined, torch.as_tensor(out.num_recv_tokens_per_expert).clone()


def main(run_dir: Path, rank: int) -> None:
    plan = json.loads((run_dir / "plan.json").read_text())
    model, world = plan["mori_model"], plan["world"]
    moriep, create_moe_dispatcher, _ = start_rank(plan, rank)
    from tests.sglang.mori_standin import EpDispatchCombineOp

    built = {layer_id: build(create_moe_dispatcher, model, world, layer_id) for layer_id in plan["layers"]}
    record = {"steps": [], "ops": [], "overflowed": 0}
    local_experts = model["num_experts"] // world

    def ops() -> None:
        record["ops"] = [(op.config.max_num_inp_token_per_rank, str(op.config.kernel_type), op.max_num_tokens_to_recv())
                         for op in EpDispatchCombineOp.built]
        record["overflowed"] = EpDispatchCombineOp.overflowed

    run_planned_steps(run_dir, rank, plan, model, [built[layer_id] for layer_id in sorted(built)], 2000,
                      lambda layer, x, ids, weights, planned: dict(
                          zip(("combined", "received"), step(moriep, layer, x, ids, weights, rank, local_experts))),
                      record, ops)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
