"""One SGLang scheduler rank, as far as the MoE A2A goes: run by the sglang venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first,
then ``publish(server_args, role="scheduler", ranks=...)`` and SGLang's start-up budget check —
then builds real ``FlashinferDispatcher`` layers (MoeRunnerConfig with layer ids; target layers,
draft layers under SGLang's speculative context, an SP-prefill layer) and runs the plan's steps:
SGLang's DP token counts published with ``set_dp_buffer_len``, dispatch, an expert stand-in
(2 x the rows), combine. The one stand-in is FlashInfer's MoeAlltoAll (``standin.py``).

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
from dataclasses import dataclass
from pathlib import Path

RELEASE_TIMEOUT_S = 300


@dataclass
class SGLangRank:
    """A published scheduler rank in a gloo group, ready to build dispatchers."""

    rank: int
    world: int
    model: dict
    module: object  # sglang's token_dispatcher.flashinfer, the stand-in installed
    required_cap: int

    def build(self, layer_id: int, **extra):
        import torch
        import torch.distributed as dist
        from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
        from sglang.srt.layers.moe.utils import MoeRunnerBackend

        hidden, top_k, experts = self.model["hidden_size"], self.model["top_k"], self.model["num_experts"]
        config = MoeRunnerConfig(num_experts=experts, num_local_experts=experts // self.world, hidden_size=hidden,
                                 layer_id=layer_id, top_k=top_k, num_fused_shared_experts=0,
                                 params_dtype=torch.bfloat16, runner_backend=MoeRunnerBackend.FLASHINFER_CUTLASS)
        layer = self.module.FlashinferDispatcher(
            group=dist.group.WORLD, router_topk=top_k, num_experts=experts, num_local_experts=experts // self.world,
            hidden_size=hidden, params_dtype=torch.bfloat16, moe_runner_config=config, **extra)
        layer.set_quant_config({})
        return layer

    def build_draft(self, layer_id: int):
        from sglang.srt.runtime_context import get_flags

        moe_flags = get_flags().moe
        moe_flags.speculative_context = True  # what SGLang sets while it builds a draft model
        try:
            return self.build(layer_id)
        finally:
            moe_flags.speculative_context = False

    def step(self, layer, hidden_states, topk_ids, topk_weights):
        """One MoE layer's communication as SGLang runs it around the experts (2 x the rows here)."""
        from sglang.srt.layers.moe.topk import StandardTopKOutput

        out = layer.dispatch(hidden_states, StandardTopKOutput(topk_weights, topk_ids, None))
        expert_output = out.hidden_states * 2
        if out.moe_output is not None:  # payload_in_workspace: the experts write into the workspace
            out.moe_output.copy_(expert_output)
            expert_output = out.moe_output
        return layer.combine(self.module.FlashinferCombineInput(expert_output))


def start_rank(plan: dict, rank: int) -> SGLangRank:
    world = plan["world"]
    # SGLang's scheduler configures logging this way (configure_scheduler_process), before the model.
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(name)s %(levelname)s: %(message)s")

    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch.distributed as dist
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.layers.moe.token_dispatcher import flashinfer as dispatcher_module
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    from tests.sglang import standin

    standin.install(dispatcher_module)
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="flashinfer",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True,
        moe_runner_backend="flashinfer_cutlass", **plan.get("server_args", {}),
    )
    if plan.get("hide_hook_target"):  # a release where the target moved: the plugin must stand aside
        owner, _, name = plan["hide_hook_target"].rpartition(".")
        delattr(pkgutil.resolve_name(owner), name)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
    moe_hook.validate_flashinfer_a2a_token_budget(server_args)  # SGLang's start-up floor
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    return SGLangRank(rank, world, plan["model"], dispatcher_module,
                      moe_hook._required_flashinfer_a2a_dispatch_tokens_per_rank(server_args))


def main(run_dir: Path, rank: int) -> None:
    import torch
    from sglang.srt.layers.dp_attention import set_dp_buffer_len
    from sglang.srt.runtime_context import get_forward

    plan = json.loads((run_dir / "plan.json").read_text())
    sglang = start_rank(plan, rank)
    # Built out of order: the step leader must be the lowest layer id, not the first built.
    target = [sglang.build(layer_id) for layer_id in plan["target_layers"]]
    sp_prefill = [sglang.build(layer_id, enable_sp_prefill_a2a=True) for layer_id in plan.get("sp_prefill_layers", [])]
    draft = [sglang.build_draft(layer_id) for layer_id in plan.get("draft_layers", [])]

    model = plan["model"]
    generator = torch.Generator().manual_seed(1000 + rank)
    record = {"outputs": [], "topk_ids": [], "workspace_size": target[0].workspace_size,
              "required_cap": sglang.required_cap}

    def run_layers(layers, local_tokens: int) -> None:
        for layer in layers:
            x = torch.randn(local_tokens, model["hidden_size"], generator=generator).to(torch.bfloat16)
            ids = torch.randint(0, model["num_experts"], (local_tokens, model["top_k"]), generator=generator,
                                dtype=torch.int32)
            weights = torch.rand(local_tokens, model["top_k"], generator=generator)
            record["topk_ids"].append(ids)
            record["outputs"].append(sglang.step(layer, x, ids, weights).clone())

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
