"""One SGLang 0.5.23 scheduler rank with ``--moe-a2a-backend megamoe``, as far as the MoE goes: run by the sglang
venv's python.

Does what ``run_scheduler_process`` does before the model is built — ``load_plugins()`` first, ``publish``,
``configure_scheduler_process`` (where the capwatch plugin starts), ``initialize_moe_config()`` — with SGLang's EP
group the gloo world, then runs the plan's steps through SGLang's own ``layers/moe/mega_moe.py`` the way the
models do (``DeepseekV2MoE.forward``, ``Qwen3MoeSparseMoeBlock._forward_mega_moe``): the DP group's token counts
published with ``set_dp_buffer_len``, ``should_use_mega_moe(moe, hidden_states)``, then
``run_mega_routed_experts(...)`` on the mega path, or the non-mega path's stand-in (2 x the rows, as the experts
do). A ``capture`` step runs under SGLang's ``model_capture_mode()``. The stand-ins are DeepGEMM and the GPU's
facts (``megamoe_standin.py``: and SGLang's own ``override_platform(is_cuda=True, is_sm100=True)`` while the
server args resolve) and each layer's ``moe`` (its experts, config and shared-expert fields). The model is a
DeepSeek-V3-shaped one (``plan["model_dir"]``): DeepSeek's MoE is the one that falls back.

A ``pause`` step writes the record and ``paused-<r>`` and waits for ``resume``. Writes ``rank-<r>.pt`` (every
output with its input, routing and path; the buffers built), then ``ready-<r>`` and waits for ``release``. A batch
SGLang's assertion refuses ends the rank, as it would end a scheduler.

    python -m tests.sglang.megamoe_rank_program RUN_DIR RANK
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

from tests.sglang.deepep_rank_program import run_planned_steps


def start_rank(plan: dict, rank: int):
    """Publish a Mega MoE server's args, join the gloo group as SGLang's EP group; SGLang's mega_moe module."""
    from tests.sglang.rank_program import _PROCESS_SCOPE, begin_scheduler_process, publish_and_configure

    world = plan["world"]
    begin_scheduler_process(rank)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # first thing, as in run_scheduler_process

    import torch.distributed as dist
    from sglang.srt.layers.moe import mega_moe
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.runtime_context import get_parallel, override_platform
    from sglang.srt.server_args import ServerArgs

    from tests.sglang import megamoe_standin

    megamoe_standin.install()  # as if DeepGEMM were installed: before the plugin checks it
    megamoe_standin.install_device(mega_moe)
    server_args = ServerArgs(
        model_path=plan["model_dir"], skip_tokenizer_init=True, device="cpu", moe_a2a_backend="megamoe",
        tp_size=world, ep_size=world, dp_size=world, enable_dp_attention=True, **plan.get("server_args", {}))
    # The machine SGLang's launcher checks Mega MoE against (check_mega_moe_compat): a CUDA SM100 GPU.
    with override_platform(is_cuda=True, is_sm100=True):
        publish_and_configure(server_args, rank, world)  # the plugin's start hook runs in it
    moe_utils.initialize_moe_config()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['master_port']}", rank=rank,
                            world_size=world)
    # SGLang's EP group is built on the GPUs (NCCL); here the gloo world is that group, stated SGLang's way.
    _PROCESS_SCOPE.enter_context(get_parallel().override(
        moe_ep_group=types.SimpleNamespace(device_group=dist.group.WORLD)))
    return mega_moe


def layer(model: dict, layer_id: int):
    """A DeepSeek-style MoE layer as should_use_mega_moe and _mega_moe_buffer read it."""
    from tests.sglang import megamoe_standin

    config = types.SimpleNamespace(hidden_size=model["hidden_size"], num_experts_per_tok=model["top_k"],
                                   moe_intermediate_size=model["intermediate_size"])
    return types.SimpleNamespace(experts=megamoe_standin.experts(model["num_experts"], layer_id), config=config,
                                 num_fused_shared_experts=0, n_shared_experts=0, mega_shared_l1_weights=None)


def step(mega_moe, moe, hidden_states, topk_ids, topk_weights):
    """One MoE layer as the models run it: SGLang's decision, then the mega path or the non-mega one."""
    import torch

    if mega_moe.should_use_mega_moe(moe, hidden_states):
        tokens = hidden_states.shape[0]
        output = mega_moe.run_mega_routed_experts(
            moe.experts, hidden_states, topk_ids if tokens else None, topk_weights if tokens else None,
            hidden_size=moe.config.hidden_size, intermediate_size=moe.config.moe_intermediate_size,
            top_k=moe.config.num_experts_per_tok, num_tokens=tokens)
        return output, "mega"
    output = (hidden_states.float() * 2 * topk_weights.sum(1, keepdim=True)).to(torch.bfloat16)
    return output, "fallback"


def as_draft(moe_utils):
    """A draft model's forward as SGLang's EAGLE worker runs it: in ``speculative_moe_a2a_backend_context()``, its
    speculative A2A backend Mega MoE (what ``--speculative-moe-a2a-backend megamoe`` resolves to)."""
    from sglang.srt.runtime_context import get_flags

    get_flags().moe.speculative_a2a_backend = get_flags().moe.a2a_backend
    return moe_utils.speculative_moe_a2a_backend_context()


def main(run_dir: Path, rank: int) -> None:
    from sglang.srt.layers.dp_attention import set_dp_buffer_len
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.model_executor.runner import model_capture_mode

    from tests.sglang.megamoe_standin import SymmBuffer

    plan = json.loads((run_dir / "plan.json").read_text())
    model = plan["megamoe_model"]
    mega_moe = start_rank(plan, rank)
    layers = [layer(model, layer_id) for layer_id in sorted(plan["layers"])]
    drafts = {id(moe) for moe, layer_id in zip(layers, sorted(plan["layers"])) if layer_id in plan.get("draft", ())}
    record = {"steps": [], "buffers": []}

    def buffers() -> None:
        record["buffers"] = [(int(buffer.buffer.nbytes), buffer.num_max_tokens_per_rank) for buffer in SymmBuffer.built]

    @contextlib.contextmanager
    def around_step(planned: dict):
        group_tokens = planned["tokens"]
        set_dp_buffer_len(sum(group_tokens), group_tokens[rank], False, list(group_tokens))
        with model_capture_mode() if planned.get("capture") else contextlib.nullcontext():
            yield

    def dispatch_one(moe, x, ids, weights, planned):
        with as_draft(moe_utils) if id(moe) in drafts else contextlib.nullcontext():
            return dict(zip(("output", "path"), step(mega_moe, moe, x, ids, weights)))

    run_planned_steps(run_dir, rank, plan, model, layers, 1000, dispatch_one, record, buffers, around_step)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
