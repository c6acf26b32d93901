"""One SGLang scheduler rank with ``--moe-a2a-backend deepep``, as far as the MoE A2A goes: run by the sglang
venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first (when the plan
asks), ``publish(server_args, role="scheduler", ranks=...)``, ``configure_scheduler_process`` (with the plugin),
``initialize_moe_config()`` — then builds each
MoE layer's dispatcher with SGLang's own ``create_moe_dispatcher`` (a ``MaybeTboDeepEPDispatcher``: one inner
``DeepEPDispatcher`` per micro-batch with two-batch overlap) and runs the plan's decode steps: dispatch, an
expert stand-in (2 x the rows), combine. SGLang's TP group is the gloo world here. The one stand-in is
``deep_ep.Buffer`` (``deepep_standin.py``).

With ``plugins`` in the plan, ``load_plugins()`` runs first and ``configure_scheduler_process`` after ``publish``
(where the capwatch plugin starts), as in ``run_scheduler_process``. A ``pause`` step writes the record and
``paused-<r>`` and waits for ``resume`` (the test scrapes and queries meanwhile).

Writes ``rank-<r>.pt`` (every combine output with its input and routing, the received counts, the buffers
built) to the run folder, then ``ready-<r>`` and waits for ``release`` before exiting. A dispatch DeepEP
refuses ends the rank with DeepEP's error, as it would end an SGLang scheduler.

    python -m tests.sglang.deepep_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import contextlib
import inspect
import json
import pickle
import sys
import time
import types
from pathlib import Path

RELEASE_TIMEOUT_S = 300


def start_rank(plan: dict, rank: int):
    """Publish a DeepEP server's args, join the gloo group, and return SGLang's dispatcher module and factory."""
    from tests.sglang.rank_program import begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    if plan.get("plugins"):
        from sglang.srt.plugins import load_plugins

        load_plugins()  # first thing, as in run_scheduler_process

    import torch
    import torch.distributed as dist
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton import layer as fused_moe_layer
    from sglang.srt.layers.moe.token_dispatcher import deepep
    from sglang.srt.server_args import ServerArgs

    from tests.sglang import deepep_standin

    if not plan.get("unbuildable"):  # unbuildable: deep_ep does not import here, as in a server without DeepEP
        deepep_standin.install(deepep)  # as if deep_ep had imported: before the plugin checks it
    if plan.get("resolved_server_args"):  # resolved by a launcher (apply_launcher_program.py), as SGLang passes them
        server_args = pickle.loads(Path(plan["resolved_server_args"]).read_bytes())
    else:
        server_args = deepep_server_args(ServerArgs, plan)
    publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it, with the GPU index
    moe_utils.initialize_moe_config()  # what the scheduler does once the config is published
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    fused_moe_layer._get_deepep_comm_group = lambda a2a_backend: dist.group.WORLD
    # get_deepep_buffer's two device queries (an SM count for a warning, MNNVL support) have no CPU answer.
    torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(multi_processor_count=132)
    deepep._is_mnnvl_fabric_supported = lambda: False
    return deepep, fused_moe_layer.create_moe_dispatcher


def deepep_server_args(server_args_class, plan: dict):
    """The plan's server: DeepEP's A2A over ``world`` DP-attention ranks on CPU."""
    world = plan["world"]
    return server_args_class(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="deepep",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, deepep_mode=plan["deepep_mode"],
        deepep_dispatcher_output_dtype=plan.get("dispatch_dtype", "bf16"),
        enable_two_batch_overlap=plan.get("two_batch_overlap", False), **plan.get("server_args", {}))


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
    # 0.5.21 on also take the quant method (None here); before, the config alone.
    dispatcher = create_moe_dispatcher(config, *([None] if len(inspect.signature(create_moe_dispatcher).parameters) > 1
                                                 else []))
    dispatcher.set_quant_config({})
    return dispatcher


def step(deepep, dispatcher, hidden_states, topk_ids, topk_weights, micro_batch: int | None):
    """One MoE layer's communication as SGLang runs it around the experts (2 x the rows here)."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    from tests.sglang.deepep_standin import dequantized

    index = {} if micro_batch is None else {"tbo_subbatch_index": micro_batch}
    out = dispatcher.dispatch(hidden_states=hidden_states, topk_output=StandardTopKOutput(topk_weights, topk_ids, None),
                              **index)
    expert_output = (dequantized(out.hidden_states, out.hidden_states_scale) * 2).to(hidden_states.dtype)
    combined = dispatcher.combine(combine_input=deepep.DeepEPLLCombineInput(expert_output, out.topk_ids,
                                                                             out.topk_weights), **index)
    return combined, out.masked_m.clone()


def _caps(obj, depth: int = 4) -> set[int]:
    """The caps the dispatcher objects under ``obj`` were built with (``num_max_dispatch_tokens_per_rank``)."""
    found = set()
    if isinstance(getattr(obj, "num_max_dispatch_tokens_per_rank", None), int):
        found.add(obj.num_max_dispatch_tokens_per_rank)
    if depth:
        for value in getattr(obj, "__dict__", {}).values():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if hasattr(item, "__dict__") and type(item).__module__.startswith("sglang"):
                    found |= _caps(item, depth - 1)
    return found


def main(run_dir: Path, rank: int) -> None:
    import torch

    from tests.sglang.deepep_standin import Buffer

    plan = json.loads((run_dir / "plan.json").read_text())
    model, world = plan["deepep_model"], plan["world"]
    deepep, create_moe_dispatcher = start_rank(plan, rank)
    if plan.get("unbuildable"):  # SGLang's own constructor refuses: its error, while the test scrapes
        from tests.sglang.rank_program import wait_for_release
        try:
            build(create_moe_dispatcher, model, world, plan["layers"][0])
            error = "built"
        except Exception as raised:  # noqa: BLE001 - whatever SGLang raises is the record
            error = f"{type(raised).__name__}: {raised}"
        (run_dir / f"build-error-{rank}").write_text(error)
        wait_for_release(run_dir, rank)
        return
    built = {layer_id: build(create_moe_dispatcher, model, world, layer_id) for layer_id in plan["layers"]}
    layers = [built[layer_id] for layer_id in sorted(built)]  # built in the plan's order, run in the model's
    generator = torch.Generator().manual_seed(1000 + rank)
    record = {"steps": [], "buffers": []}

    def save() -> None:
        record["caps"] = sorted({cap for layer in layers for cap in _caps(layer)})
        record["buffers"] = [(buffer.num_nvl_bytes, buffer.num_rdma_bytes, buffer.low_latency_mode,
                              getattr(buffer, "nvshmem_qp_depth", None)) for buffer in Buffer.built]
        torch.save(record, run_dir / f"rank-{rank}.pt")

    for planned in plan["steps"]:
        if planned.get("pause"):  # what the test checks while the ranks are alive, before the steps after it
            save()
            (run_dir / f"paused-{rank}").write_text("")
            _wait_for(run_dir / "resume")
            continue
        # A step's micro-batches (two with two-batch overlap), each its own dispatch through its own dispatcher.
        micro_batches = planned["micro_batches"][rank] if "micro_batches" in planned else [planned["tokens"][rank]]
        for index, tokens in enumerate(micro_batches):
            for layer in layers:
                x = torch.randn(tokens, model["hidden_size"], generator=generator).to(torch.bfloat16)
                # Distinct experts per token, as a router picks them.
                ids = torch.rand(tokens, model["num_experts"], generator=generator).topk(model["top_k"]).indices
                weights = torch.rand(tokens, model["top_k"], generator=generator)
                save()  # what happened so far survives a dispatch that ends the rank
                combined, received = step(deepep, layer, x, ids, weights,
                                          index if len(micro_batches) > 1 else None)
                record["steps"].append({"x": x, "ids": ids, "weights": weights, "combined": combined,
                                        "received": received})
    save()
    (run_dir / f"ready-{rank}").write_text("")
    _wait_for(run_dir / "release")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def run_planned_steps(run_dir: Path, rank: int, plan: dict, model: dict, layers: list, seed: int, dispatch_one,
                      record: dict, before_save=lambda: None, around_step=lambda planned: contextlib.nullcontext()
                      ) -> None:
    """The plan's steps through every layer, as the one-dispatch-per-layer rank programs run them (Mooncake EP,
    NIXL EP, MoRI, pplx, DeepEP v2, MegaMoE, FlashInfer MegaMoE): random tokens, experts and weights from a
    per-rank ``seed``; ``dispatch_one(layer, x, ids, weights, planned)`` -> a dict of what to record beside them
    per layer (``around_step(planned)`` a context around each step's layers); the record saved before each dispatch
    (it survives one that ends the rank, ``before_save`` refreshing what it holds), a ``pause`` step waiting for
    ``resume``; then ``ready`` and a wait for ``release``."""
    import torch

    generator = torch.Generator().manual_seed(seed + rank)

    def save() -> None:
        before_save()
        torch.save(record, run_dir / f"rank-{rank}.pt")

    for planned in plan["steps"]:
        if planned.get("pause"):
            save()
            (run_dir / f"paused-{rank}").write_text("")
            _wait_for(run_dir / "resume")
            continue
        tokens = planned["tokens"][rank]
        with around_step(planned):
            for layer in layers:
                x = torch.randn(tokens, model["hidden_size"], generator=generator).to(torch.bfloat16)
                ids = torch.rand(tokens, model["num_experts"], generator=generator).topk(model["top_k"]).indices
                weights = torch.rand(tokens, model["top_k"], generator=generator)
                save()  # what happened so far survives a dispatch that ends the rank
                record["steps"].append({"x": x, "ids": ids, "weights": weights,
                                        **dispatch_one(layer, x, ids, weights, planned)})
    save()
    (run_dir / f"ready-{rank}").write_text("")
    _wait_for(run_dir / "release")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
