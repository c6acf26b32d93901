"""MoRI's dispatch in SGLang (``--moe-a2a-backend mori``, EPv1): what the plugin hooks, per release.

MoRI checks nothing: a rank whose batch is larger than ``SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` makes
MoRI write past its buffers (ROCm/mori#356), which corrupts memory silently. The plugin's guard is the only thing
that can make it loud, so here an overflow is **counted, reported (the final report, bounded wait:
``CAPWATCH_FINAL_REPORT_TIMEOUT_S``), logged in one line naming the variable to set, and the dispatch refused**
(``CapOverflowError``) before anything reaches MoRI: the rank ends instead of computing on corrupt memory.

SGLang builds one ``_MoriEP*DispatcherImpl*`` per ``MoriEPDispatcher`` (one per MoE layer, one per micro-batch
with two-batch overlap); every one of them (normal and low-latency mode alike) takes each rank's own batch
against the cap (``max_num_inp_token_per_rank``), so R is the local batch (``rules.local_batch_cap``). The plugin
adopts each one SGLang constructs and counts its ``dispatch_a`` (before the transport: the low-latency impl sends
in it, the normal one in ``dispatch_b``) as every local-batch backend's is counted (``hooks/local_batch.py``: the
guard on host ints, the step on the leader, the (token, expert) pairs sent in one ``put_`` on the leader's layer),
except that an overflow is refused, not handed on. MoRI says what each rank received only through a host sync
(``get_dispatch_src_token_pos``), so the received row stays 0 on MoRI ranks.

At a role's first dispatch the plugin asks the dispatcher for its op (``mori_op``, built by ``init_mori_op`` then
anyway) and reports what sizes it (``MoriOp``: the kernel, the experts per rank, the scales, the combine
quantization, the receive cap) and its bytes as capwatch prices them (``sizing/mori.py``: MoRI reports none).

MoRI EPv2 (``SGLANG_MORI_EP_V2``, 0.5.22 on) sizes a different arena: the plugin refuses it before hooking.
"""

from __future__ import annotations

import logging
import os
import pkgutil

from capwatch.backends.mori import MoriOp, op_config
from capwatch.dispatcher.counting import CapOverflowError, LayerCounting
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_plugin.floors import mori as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.hooks import adoption, local_batch
from capwatch.sglang_plugin.releases import VERIFIED, Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.mori import MORI as MORI_RULES
from capwatch.sizing.mori import mori_op_plan

MORI = bind(MORI_RULES)  # with SGLang's variable and default for its cap

logger = logging.getLogger("capwatch.sglang")

NAME = MORI.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.moriep"
BASE = f"{MODULE}._MoriEPDispatcherImplBase"
INIT = Target(f"{BASE}.__init__", ("group", "router_topk", "permute_fusion", "num_experts", "num_local_experts",
                                   "hidden_size", "params_dtype"))
DISPATCH_A = Target(f"{BASE}.dispatch_a", ("hidden_states", "topk_output"))
INIT_OP = Target(f"{MODULE}.init_mori_op", ("group", "router_topk", "num_experts", "num_local_experts",
                                              "hidden_size", "params_dtype", "num_max_dispatch_tokens_per_rank"))
GET_PARALLEL = Target("sglang.srt.runtime_context.get_parallel")  # .moe_ep_rank, .moe_ep_size
EPV2_VARIABLE = "SGLANG_MORI_EP_V2"
LIBRARY = "mori"  # SGLang imports it to build the dispatcher's op (init_mori_op)


# tests/sglang/test_mori_plugin.py: on 0.5.19 and 0.5.23
EPV1_ADAPTER = Adapter(releases=VERIFIED, hooked=(INIT, DISPATCH_A, INIT_OP, GET_PARALLEL, *adoption.COMMON_TARGETS))
ADAPTERS = EPV1_ADAPTER.by_release()


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why MoRI's dispatch cannot be instrumented with ``adapter``, or None: MoRI imports (SGLang cannot build the
    dispatcher's op without it: the backend is unavailable), EPv2 (sized otherwise), then every target and
    signature."""
    try:
        pkgutil.resolve_name(LIBRARY)
    except Exception as error:
        return library_missing("MoriEPDispatcher", LIBRARY, error, "MoRI (github.com/ROCm/mori, on a ROCm server)")
    if os.environ.get(EPV2_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return (f"{EPV2_VARIABLE} is on: capwatch sizes and counts MoRI's EPv1 op only (EPv2's arena is sized "
                "otherwise)")
    return first_problem(adapter.targets())


# --- the hooks --------------------------------------------------------------------------------------

def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    adoption.register(session, source, INIT, adopt, "MoRI")


def adopt(session, dispatcher, role: str, layer_id: int | None) -> LayerCounting:
    """Count one MoRI dispatcher impl (MoRI's op is SGLang's: nothing allocated but the counters and scratch), in
    the MoE expert-parallel group SGLang's runtime context names; both micro-batches' of the lowest layer lead."""
    parallel = pkgutil.resolve_name(GET_PARALLEL.name)()
    counted = local_batch.Counted(cap=dispatcher.num_max_dispatch_tokens_per_rank, ep_rank=parallel.moe_ep_rank,
                                  ep_size=parallel.moe_ep_size, hidden_size=dispatcher.hidden_size,
                                  top_k=dispatcher.router_topk, num_experts=dispatcher.num_experts)
    return local_batch.adopt(session, dispatcher, "dispatch_a", counted, MORI, role, layer_id,
                             lambda: describe_op(session, dispatcher, role, counted.ep_size),
                             lead_per_micro_batch=True, overflow=refuse_overflow)


def unadopt(dispatcher) -> None:
    """SGLang's dispatcher exactly as shipped again."""
    adoption.unadopt(dispatcher, "dispatch_a")


def describe_op(session, dispatcher, role: str, ep_size: int) -> dict:
    """The dispatcher's MoRI op (built now if the first dispatch has not yet: ``mori_op`` builds it lazily),
    counted once per op, and what the reports carry to price it at any other cap."""
    op = dispatcher.mori_op
    config = op.config
    reported = MoriOp(kernel=getattr(config.kernel_type, "name", str(config.kernel_type)),
                      combine_quant=str(config.quant_type).lower(),
                      experts_per_rank=int(config.num_experts_per_rank), scale_dim=int(config.scale_dim),
                      scale_type_size=int(config.scale_type_size),
                      max_total_recv_tokens=int(config.max_total_recv_tokens),
                      token_bytes=int(config.max_token_type_size))
    plan = mori_op_plan(op_config(ep_size, int(config.hidden_dim), int(config.num_experts_per_token), reported),
                        int(config.max_num_inp_token_per_rank))
    return local_batch.reported(session, role, MORI, op, plan.op_bytes, reported)


def refuse_overflow(layer: LayerCounting, local_tokens: int) -> None:
    """A batch MoRI would write past its buffers with: counted, reported (bounded wait), logged in one line, then
    refused (``CapOverflowError``) before MoRI's op sees it."""
    try:
        layer.guard(local_tokens, local_tokens)
    except CapOverflowError as overflow:
        logger.error("capwatch: %s (counted and reported; capwatch refused the dispatch, which would corrupt "
                     "memory silently in MoRI)", overflow)
        raise
