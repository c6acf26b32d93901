"""One SGLang 0.5.22 - 0.5.23 scheduler rank with ``--moe-a2a-backend deepep_v2``, as far as the MoE A2A goes: run
by the sglang venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first, ``publish``,
``configure_scheduler_process`` (where the capwatch plugin starts), ``initialize_moe_config()`` — then builds each
MoE layer's dispatcher with SGLang's own ``create_moe_dispatcher`` (a ``DeepEPv2Dispatcher``, its group SGLang's
TP group: the gloo world here) and runs the plan's steps: dispatch (decode, or prefill with ``extend``), an expert
stand-in (2 x the rows), combine. The one stand-in is ``deep_ep.ElasticBuffer`` (``deepep_v2_standin.py``).

A ``pause`` step writes the record and ``paused-<r>`` and waits for ``resume``. Writes ``rank-<r>.pt`` (every
combine output with its input and routing, the buffers built), then ``ready-<r>`` and waits for ``release``. A
dispatch SGLang refuses ends the rank with SGLang's ``ValueError``, as it would end a scheduler.

    python -m tests.sglang.deepep_v2_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import inspect
import json
import sys
import types
from pathlib import Path

from tests.sglang.deepep_rank_program import run_planned_steps


def start_rank(plan: dict, rank: int):
    """Publish a DeepEP v2 server's args, join the gloo group; SGLang's dispatcher module and factory."""
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch.distributed as dist
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_moe_layer
    from sglang.srt.layers.moe.token_dispatcher import deepep_v2
    from sglang.srt.server_args import ServerArgs

    from tests.sglang import deepep_v2_standin

    deepep_v2_standin.install(deepep_v2)  # as if deep_ep had imported: before the plugin checks it
    # The test's tiny Qwen2-MoE through SGLang's own door for model packages (DeepEP v2 admits registered ones).
    from sglang.srt.configs.moe_model_registry import register_deepep_v2_model

    register_deepep_v2_model("Qwen2MoeForCausalLM")
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="deepep_v2",
        tp_size=world, ep_size=world, **plan.get("server_args", {}))
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it
    moe_utils.initialize_moe_config()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    # SGLang's TP group is built on the GPUs (NCCL); here the gloo world is that group, stated SGLang's way.
    from sglang.srt.runtime_context import get_parallel

    from tests.sglang.rank_program import _PROCESS_SCOPE

    _PROCESS_SCOPE.enter_context(get_parallel().override(
        tp_group=types.SimpleNamespace(device_group=dist.group.WORLD)))
    return deepep_v2, fused_moe_layer.create_moe_dispatcher


def build(create_moe_dispatcher, model: dict, world: int, layer_id: int):
    import torch
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    experts = model["num_experts"]
    fields = dict(num_experts=experts, num_local_experts=experts // world, hidden_size=model["hidden_size"],
                  layer_id=layer_id, top_k=model["top_k"], num_fused_shared_experts=0, params_dtype=torch.bfloat16,
                  runner_backend=MoeRunnerBackend.DEEP_GEMM)  # runner_backend: 0.5.23 on
    accepted = inspect.signature(MoeRunnerConfig).parameters
    config = MoeRunnerConfig(**{name: value for name, value in fields.items() if name in accepted})
    # BF16 experts (SGLang's unquantized method): DeepEP v2 then dispatches bf16 (FP8 needs SGLang's GPU kernel).
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    return create_moe_dispatcher(config, UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod))


def step(deepep_v2, dispatcher, hidden_states, topk_ids, topk_weights, extend: bool):
    """One MoE layer's communication as SGLang runs it around the experts (2 x the rows here)."""
    from sglang.srt.layers.dp_attention import set_is_extend_in_batch
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    set_is_extend_in_batch(extend)
    out = dispatcher.dispatch(hidden_states, StandardTopKOutput(topk_weights, topk_ids, None))
    combined = dispatcher.combine(deepep_v2.DeepEPv2CombineInput(out.hidden_states * 2, out.topk_weights))
    return combined


def main(run_dir: Path, rank: int) -> None:
    from tests.sglang.deepep_v2_standin import ElasticBuffer

    plan = json.loads((run_dir / "plan.json").read_text())
    model, world = plan["deepep_model"], plan["world"]
    deepep_v2, create_moe_dispatcher = start_rank(plan, rank)
    built = {layer_id: build(create_moe_dispatcher, model, world, layer_id) for layer_id in plan["layers"]}
    record = {"steps": [], "buffers": []}

    def buffers() -> None:
        record["buffers"] = [(buffer.num_bytes, buffer.num_max_tokens_per_rank) for buffer in ElasticBuffer.built]

    run_planned_steps(run_dir, rank, plan, model, [built[layer_id] for layer_id in sorted(built)], 1000,
                      lambda layer, x, ids, weights, planned: {
                          "combined": step(deepep_v2, layer, x, ids, weights, planned.get("extend", False))},
                      record, buffers)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
