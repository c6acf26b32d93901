"""One SGLang scheduler rank, as far as the MoE A2A goes: run by the sglang venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first,
then ``publish(server_args, role="scheduler", ranks=...)`` — then builds real ``FlashinferDispatcher``
layers (MoeRunnerConfig with layer ids; target layers, optionally draft layers under SGLang's
speculative context and an SP-prefill layer) and runs the plan's decode steps: SGLang's DP
token counts published with ``set_dp_buffer_len``, dispatch, an expert stand-in (2 x the rows),
combine. The one stand-in is FlashInfer's MoeAlltoAll (``standin.py``).

Writes ``rank-<r>.pt`` (every combine output, and the routing) to the run folder, then
``ready-<r>`` and waits for ``release`` (the test scrapes ``/metrics`` meanwhile) before exiting.

    python [-O] -m tests.sglang.rank_program RUN_DIR RANK
"""

from __future__ import annotations

import json
import logging
import pkgutil
import sys
import time
from pathlib import Path

RELEASE_TIMEOUT_S = 300


def main(run_dir: Path, rank: int) -> None:
    plan = json.loads((run_dir / "plan.json").read_text())
    world = plan["world"]
    # SGLang's scheduler configures logging this way (configure_scheduler_process), before the model.
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(name)s %(levelname)s: %(message)s")

    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch
    import torch.distributed as dist
    from sglang.srt.layers.dp_attention import set_dp_buffer_len
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.token_dispatcher import flashinfer as dispatcher_module
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.runtime_context import SpawnRanks, get_flags, get_forward, publish
    from sglang.srt.server_args import ServerArgs

    from tests.sglang import standin

    standin.install(dispatcher_module)
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="flashinfer",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True,
        moe_runner_backend="flashinfer_cutlass", **plan.get("server_args", {}),
    )
    if plan.get("hide_hook_target"):  # a release where the target moved: the plugin must stand aside
        module, _, name = plan["hide_hook_target"].rpartition(".")
        delattr(pkgutil.resolve_name(module), name)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
    from sglang.srt.arg_groups import moe_hook

    moe_hook.validate_flashinfer_a2a_token_budget(server_args)  # SGLang's start-up floor
    required_cap = moe_hook._required_flashinfer_a2a_dispatch_tokens_per_rank(server_args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)

    model = plan["model"]
    hidden, top_k, experts = model["hidden_size"], model["top_k"], model["num_experts"]

    def build(layer_id: int, **extra):
        config = MoeRunnerConfig(num_experts=experts, num_local_experts=experts // world, hidden_size=hidden,
                                 layer_id=layer_id, top_k=top_k, num_fused_shared_experts=0,
                                 params_dtype=torch.bfloat16, runner_backend=MoeRunnerBackend.FLASHINFER_CUTLASS)
        layer = dispatcher_module.FlashinferDispatcher(
            group=dist.group.WORLD, router_topk=top_k, num_experts=experts, num_local_experts=experts // world,
            hidden_size=hidden, params_dtype=torch.bfloat16, moe_runner_config=config, **extra)
        layer.set_quant_config({})
        return layer

    # Built out of order: the step leader must be the lowest layer id, not the first built.
    target = [build(layer_id) for layer_id in plan["target_layers"]]
    sp_prefill = [build(layer_id, enable_sp_prefill_a2a=True) for layer_id in plan.get("sp_prefill_layers", [])]
    moe_flags = get_flags().moe
    moe_flags.speculative_context = True  # what SGLang sets while it builds a draft model
    draft = [build(layer_id) for layer_id in plan.get("draft_layers", [])]
    moe_flags.speculative_context = False

    generator = torch.Generator().manual_seed(1000 + rank)
    record = {"outputs": [], "topk_ids": [], "workspace_size": target[0].workspace_size, "required_cap": required_cap}

    def run_layers(layers, local_tokens: int) -> None:
        for layer in layers:
            x = torch.randn(local_tokens, hidden, generator=generator).to(torch.bfloat16)
            ids = torch.randint(0, experts, (local_tokens, top_k), generator=generator, dtype=torch.int32)
            weights = torch.rand(local_tokens, top_k, generator=generator)
            record["topk_ids"].append(ids)
            out = layer.dispatch(x, StandardTopKOutput(weights, ids, None))
            expert_output = out.hidden_states * 2
            if out.moe_output is not None:  # payload_in_workspace: the experts write into the workspace
                out.moe_output.copy_(expert_output)
                expert_output = out.moe_output
            combined = layer.combine(dispatcher_module.FlashinferCombineInput(expert_output))
            record["outputs"].append(combined.clone())

    forward = get_forward()
    for step in plan["steps"]:
        counts = step["dp_tokens"]
        set_dp_buffer_len(sum(counts), counts[rank], False, counts)
        if step.get("sp_prefill"):
            with forward.scoped(is_extend_in_batch=True, sp_active=True):
                run_layers(sp_prefill, counts[rank])
        else:
            run_layers(draft if step.get("draft") else target, counts[rank])

    torch.save(record, run_dir / f"rank-{rank}.pt")
    (run_dir / f"ready-{rank}").write_text("")
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while not (run_dir / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
