"""One SGLang scheduler rank, as far as the MoE A2A goes: run by the sglang venv's python, with one
release's folder (``tests/sglang/releases.py``) first on ``PYTHONPATH``.

Does what that release's ``run_scheduler_process`` does before the model is built — ``load_plugins()``
first, then ``publish(server_args, role="scheduler"[, ranks=...])``, ``configure_scheduler_process``
with its own arguments, and SGLang's start-up budget check where the release has one — then builds
real ``FlashinferDispatcher`` layers (with the release's constructor: MoeRunnerConfig with layer ids
where it takes one; target layers, draft layers under SGLang's speculative context, an SP-prefill
layer on 0.5.23) and runs the plan's steps (an extend step marks the batch as prefill):
SGLang's DP token counts published with ``set_dp_buffer_len``, dispatch, an expert stand-in
(2 x the rows), combine. The one stand-in is FlashInfer's MoeAlltoAll (``standin.py``).

Writes ``rank-<r>.pt`` (every combine output, and the routing) to the run folder, then
``ready-<r>`` and waits for ``release`` (the test scrapes ``/metrics`` meanwhile) before exiting. A plan with
``unbuildable`` (a FlashInfer SGLang cannot build its dispatcher with) builds one layer, writes what SGLang raised
to ``build-error-<r>``, then ``ready-<r>`` and waits the same way.

    python [-O] -m tests.sglang.rank_program RUN_DIR RANK
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import pickle
import pkgutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RELEASE_TIMEOUT_S = 300
_PROCESS_SCOPE = contextlib.ExitStack()  # contexts held for the rank's lifetime


@dataclass
class SGLangRank:
    """A published scheduler rank in a gloo group, ready to build dispatchers."""

    rank: int
    world: int
    model: dict
    module: object  # sglang's token_dispatcher.flashinfer, the stand-in installed
    floor: dict  # SGLang's own floor where the release has one, else 0.5.22's terms on its settings

    def build(self, layer_id: int, **extra):
        import torch
        import torch.distributed as dist
        from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
        from sglang.srt.layers.moe.utils import MoeRunnerBackend

        hidden, top_k, experts = self.model["hidden_size"], self.model["top_k"], self.model["num_experts"]
        if "moe_runner_config" in inspect.signature(self.module.FlashinferDispatcher).parameters:
            fields = dict(num_experts=experts, num_local_experts=experts // self.world, hidden_size=hidden,
                          layer_id=layer_id, top_k=top_k, num_fused_shared_experts=0, params_dtype=torch.bfloat16,
                          runner_backend=MoeRunnerBackend.FLASHINFER_CUTLASS)  # 0.5.23 on; before, server args
            accepted = inspect.signature(MoeRunnerConfig).parameters
            extra["moe_runner_config"] = MoeRunnerConfig(**{k: v for k, v in fields.items() if k in accepted})
        layer = self.module.FlashinferDispatcher(
            group=dist.group.WORLD, router_topk=top_k, num_experts=experts, num_local_experts=experts // self.world,
            hidden_size=hidden, params_dtype=torch.bfloat16, **extra)
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


def sglang_0_5_22_floor_terms(moe_hook, server_args) -> dict:
    """The terms of SGLang 0.5.22's rule, from its own source (its release folder), run in this release's
    ``moe_hook`` namespace: a cross-check of capwatch's computation for releases that lack the functions."""
    import ast

    from tests.sglang.releases import release_path

    source = (release_path("0.5.22")[0] / "sglang/srt/arg_groups/moe_hook.py").read_text()
    wanted = {"_decode_graph_dispatch_tokens_per_rank"}
    functions = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    namespace = dict(vars(moe_hook))
    exec(compile(ast.Module(body=functions, type_ignores=[]), "sglang-0.5.22 moe_hook", "exec"), namespace)
    graph_bs, tokens_per_request = namespace["_decode_graph_dispatch_tokens_per_rank"](server_args)
    view = moe_hook.resolved_view(server_args)
    graph = view.cuda_graph_config
    prefill_graph = 0
    if view.disaggregation_mode != "decode" and graph is not None and graph.prefill.backend != "disabled":
        prefill_graph = graph.prefill.max_bs or 0
    return {"decode_graph": graph_bs * tokens_per_request, "prefill_graph": prefill_graph,
            "prefill_chunk": moe_hook.max_prefill_buffer_tokens(server_args)}


def publish_scheduler(server_args, rank: int) -> None:
    """``run_scheduler_process``'s ``publish`` on this release: with the spawn ranks from 0.5.21 on."""
    from sglang.srt import runtime_context

    if "ranks" in inspect.signature(runtime_context.publish).parameters:
        runtime_context.publish(server_args, role="scheduler",
                                ranks=runtime_context.SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
    else:
        runtime_context.publish(server_args, role="scheduler")


def publish_and_configure(server_args, rank: int, world: int) -> None:
    """``run_scheduler_process``'s start on this release: publish, then the release's
    ``configure_scheduler_process`` (0.5.19 - 0.5.20 take every rank, later ones the GPU index alone),
    where the plugin starts; then the MoE widths the GPU groups would stamp."""
    from sglang.srt import runtime_context
    from sglang.srt.managers import scheduler

    publish_scheduler(server_args, rank)
    if "tp_rank" in inspect.signature(scheduler.configure_scheduler_process).parameters:
        scheduler.configure_scheduler_process(server_args, rank, tp_rank=rank, attn_cp_rank=0, moe_dp_rank=0,
                                              moe_ep_rank=rank, pp_rank=0, dp_rank=rank)
    else:
        scheduler.configure_scheduler_process(server_args, rank)
    parallel = runtime_context.get_parallel()
    # 0.5.19 - 0.5.22 read the MoE width (0.5.19) and rank off the model-parallel groups, which SGLang builds
    # on the GPUs (NCCL): what building them would stamp and answer, for this process's lifetime.
    try:
        parallel.moe_ep_size
    except RuntimeError:
        parallel.stamp_derived_widths(**runtime_context.derive_parallel_widths(
            tp_size=world, attn_cp_size=1, attn_dp_size=world, moe_ep_size=world, moe_dp_size=1, dcp_size=1,
            dcp_enabled=False))
    try:
        parallel.moe_ep_rank
    except (RuntimeError, AssertionError):
        _PROCESS_SCOPE.enter_context(parallel.override(moe_ep_rank=rank))


def begin_scheduler_process(rank: int) -> None:
    """A scheduler process's start, in SGLang's order: first the module of ``run_scheduler_process`` (what
    SGLang's spawn imports before calling it, where the plugin hooks; a zygote, ``rank_zygote.py``, imported it
    already), whose import configures logging on some releases (``configure_hf_hub_logger``); then logging at
    INFO, replacing that, as the scheduler's ``configure_logger`` does (``force=True``)."""
    from sglang.srt.managers import scheduler  # noqa: F401

    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(name)s %(levelname)s: %(message)s", force=True)


def flashinfer_server_args(server_args_class, plan: dict):
    """The plan's server: FlashInfer's A2A over ``world`` DP-attention ranks on CPU, the tiny model."""
    world = plan["world"]
    return server_args_class(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="flashinfer",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True,
        moe_runner_backend="flashinfer_cutlass", **plan.get("server_args", {}),
    )


def start_rank(plan: dict, rank: int) -> SGLangRank:
    world = plan["world"]
    begin_scheduler_process(rank)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch.distributed as dist
    from sglang.srt.arg_groups import moe_hook
    from sglang.srt.layers.moe.token_dispatcher import flashinfer as dispatcher_module
    from sglang.srt.server_args import ServerArgs

    from tests.sglang import standin

    standin.install(dispatcher_module)
    if plan.get("resolved_server_args"):  # resolved by a launcher (apply_launcher_program.py), as SGLang passes them
        server_args = pickle.loads(Path(plan["resolved_server_args"]).read_bytes())
    else:
        server_args = flashinfer_server_args(ServerArgs, plan)
    if plan.get("hide_hook_target"):  # a release where the target moved: the plugin must stand aside
        owner, _, name = plan["hide_hook_target"].rpartition(".")
        delattr(pkgutil.resolve_name(owner), name)
    publish_and_configure(server_args, rank, world)
    if hasattr(moe_hook, "validate_flashinfer_a2a_token_budget"):  # SGLang's start-up floor, 0.5.22 on
        moe_hook.validate_flashinfer_a2a_token_budget(server_args)
        floor = {"required": moe_hook._required_flashinfer_a2a_dispatch_tokens_per_rank(server_args)}
    else:  # the rule's terms by SGLang 0.5.22's own functions, run on this release's resolved settings
        floor = sglang_0_5_22_floor_terms(moe_hook, server_args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    return SGLangRank(rank, world, plan["model"], dispatcher_module, floor)


def what_plugins_did() -> dict:
    """Which plugins hold hooks in SGLang's registry, and which of capwatch's modules this process imported."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    plugins = {source.plugin_name for hooks in HookRegistry._hooks.values() for _, _, source in hooks if source}
    return {"hook_plugins": sorted(plugins),
            "capwatch_modules": sorted(name for name in sys.modules if name.split(".")[0] == "capwatch")}


def main(run_dir: Path, rank: int) -> None:
    import torch
    from sglang.srt.layers.dp_attention import set_dp_buffer_len, set_is_extend_in_batch

    plan = json.loads((run_dir / "plan.json").read_text())
    sglang = start_rank(plan, rank)
    if plan.get("unbuildable"):  # SGLang cannot build its dispatcher here: its own error, while the test scrapes
        try:
            sglang.build(plan["target_layers"][0])
            error = "built"
        except Exception as raised:  # noqa: BLE001 - whatever SGLang raises is the record
            error = f"{type(raised).__name__}: {raised}"
        (run_dir / f"build-error-{rank}").write_text(error)
        wait_for_release(run_dir, rank)
        return
    # Built out of order: the step leader must be the lowest layer id, not the first built.
    target = [sglang.build(layer_id) for layer_id in plan["target_layers"]]
    sp_prefill = [sglang.build(layer_id, enable_sp_prefill_a2a=True) for layer_id in plan.get("sp_prefill_layers", [])]
    draft = [sglang.build_draft(layer_id) for layer_id in plan.get("draft_layers", [])]

    model = plan["model"]
    generator = torch.Generator().manual_seed(1000 + rank)
    record = {"outputs": [], "topk_ids": [], "workspace_size": target[0].workspace_size,
              "floor": sglang.floor, **what_plugins_did(),
              "max_num_tokens": [layer.max_num_tokens for layer in target + sp_prefill + draft],
              "cap_environment": {name: value for name, value in os.environ.items()
                                  if name.startswith(("SGLANG_FLASHINFER_", "CAPWATCH_APPLIED_"))}}

    def run_layers(layers, local_tokens: int) -> None:
        for layer in layers:
            x = torch.randn(local_tokens, model["hidden_size"], generator=generator).to(torch.bfloat16)
            ids = torch.randint(0, model["num_experts"], (local_tokens, model["top_k"]), generator=generator,
                                dtype=torch.int32)
            weights = torch.rand(local_tokens, model["top_k"], generator=generator)
            record["topk_ids"].append(ids)
            record["outputs"].append(sglang.step(layer, x, ids, weights).clone())

    for step in plan["steps"]:
        counts = step["dp_tokens"]
        set_dp_buffer_len(sum(counts), counts[rank], False, counts)
        if step.get("sp_prefill"):
            from sglang.srt.runtime_context import get_forward

            with get_forward().scoped(is_extend_in_batch=True, sp_active=True):
                run_layers(sp_prefill, counts[rank])
        elif step.get("extend"):  # a prefill batch: 0.5.22 sends it through the A2A
            set_is_extend_in_batch(True)
            try:
                run_layers(target, counts[rank])
            finally:
                set_is_extend_in_batch(False)
        else:
            run_layers(draft if step.get("draft") else target, counts[rank])

    torch.save(record, run_dir / f"rank-{rank}.pt")
    wait_for_release(run_dir, rank)


def wait_for_release(run_dir: Path, rank: int) -> None:
    """``ready-<rank>``, then wait until the test writes ``release`` (it scrapes ``/metrics`` meanwhile)."""
    (run_dir / f"ready-{rank}").write_text("")
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while not (run_dir / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def run_scheduler(run_dir: Path, rank: int) -> None:
    """``main`` as ``run_scheduler_process`` runs a scheduler: a fatal exception is formatted with SGLang's
    ``get_exception_traceback()`` (where the plugin counts an overflow behind SGLang's assert), then the
    process dies of it (SGLang signals its parent, which kills it)."""
    try:
        main(run_dir, rank)
    except Exception:
        from sglang.srt.managers import scheduler

        logging.getLogger("rank").error("Scheduler hit an exception: %s", scheduler.get_exception_traceback())
        raise


if __name__ == "__main__":
    run_scheduler(Path(sys.argv[1]), int(sys.argv[2]))
