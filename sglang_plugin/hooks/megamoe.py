"""DeepGEMM Mega MoE in SGLang (``--moe-a2a-backend megamoe``): what the plugin hooks, on 0.5.23.

Mega MoE has no dispatcher object (SGLang gives the backend its StandardDispatcher): the A2A runs inside DeepGEMM's
kernel, called from ``layers/moe/mega_moe.py``, which reads the cap on every call. Two functions of that module are
hooked (``HookRegistry`` AROUND; the models import them at call time, so every caller sees the hooks):

- ``should_use_mega_moe(moe, hidden_states)`` decides each eager step: the mega path where R (the largest local
  batch of the DP group, ``get_dp_global_num_tokens``; this rank's own with prefill context parallelism) is within
  the cap, else the slower non-mega path — silently, no error and no log line. A captured graph always takes the mega
  path. The plugin keeps that step's R for the dispatch, or, on a step that fell back because R exceeded the cap,
  records the step (its R lands above the cap in the histogram) and counts it in the backend's own counter
  (``moe_a2a_megamoe_fallback_steps_total``), logging the first one per process with the value that stops them.
- ``run_mega_routed_experts(experts, hidden_states, ...)`` is the dispatch (also called directly by the Qwen MoE
  models, which never fall back): each rank's own batch against the cap through the one counting primitive
  (``LayerCounting``); a batch above it — a captured graph larger than the cap — is counted and reported before
  SGLang's assertion naming the variable ends the rank. The pairs each rank sends are counted from ``topk_ids`` on
  the traffic sample.

Each MoE layer (its ``experts`` object) is adopted at its first call, into the draft role when that call runs in
SGLang's speculative context (a draft model's forward), else the target's. The symmetric buffer
(``_get_mega_moe_symm_buffer``, cached per shape and SM count) reports ``buffer.nbytes``: the bytes capwatch prices
(``backends/reported.py``), counted once per buffer.
"""

from __future__ import annotations

import logging
import pkgutil

from capwatch.backends import spec_of
from capwatch.backends.reported import ReportedBuffer
from capwatch.dispatcher.counting import suggested_cap
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_plugin.floors import megamoe as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.hooks import adoption, local_batch
from capwatch.sglang_plugin.releases import CAPTURE_TARGETS, Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.byte_units import format_bytes
from capwatch.sizing.megamoe import MEGAMOE as MEGAMOE_RULES
from capwatch.sizing.reported import ReportedPricing

logger = logging.getLogger("capwatch.sglang")

MEGAMOE = bind(MEGAMOE_RULES)  # with SGLang's variable and default for its cap

NAME = MEGAMOE.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.mega_moe"
SHOULD_USE = Target(f"{MODULE}.should_use_mega_moe", ("moe", "hidden_states"))
RUN = Target(f"{MODULE}.run_mega_routed_experts", ("experts", "hidden_states", "topk_ids", "topk_weights",
                                                    "hidden_size", "intermediate_size", "top_k", "num_tokens"))
SYMM_BUFFER = Target(f"{MODULE}._get_mega_moe_symm_buffer", ("group", "num_experts", "num_max_tokens_per_rank",
                                                              "num_topk", "hidden", "intermediate_hidden",
                                                              "num_shared_experts"))
MOE_BUFFER = Target(f"{MODULE}._mega_moe_buffer", ("moe",))
# What should_use_mega_moe asks, called by the plugin the same way to tell a fallback from a step that is not Mega
# MoE's at all.
ASKED = tuple(Target(f"{MODULE}.{name}") for name in (
    "_use_amd_flydsl_mega_moe", "_mega_moe_mma_type", "get_moe_a2a_backend", "is_mega_moe_experts_ready", "get_is_capture_mode",
    "get_dp_global_num_tokens", "is_dsa_enable_prefill_cp"))
PARALLEL = Target("sglang.srt.runtime_context.get_parallel")  # .moe_ep_group.device_group: the EP group
LIBRARY = "deep_gemm"
FALLBACK_STEPS = spec_of(NAME).series.counters[0].field


# verified on 0.5.23 (tests/sglang/test_megamoe_plugin.py)
ADAPTER = Adapter(releases=("0.5.23",), hooked=(SHOULD_USE, RUN, SYMM_BUFFER, MOE_BUFFER, *ASKED, PARALLEL,
                                                adoption.GET_FLAGS, *CAPTURE_TARGETS))
ADAPTERS = ADAPTER.by_release()


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why Mega MoE cannot be instrumented, or None: DeepGEMM's Mega MoE imports (SGLang imports it at the first
    call, which raises without it: the backend is unavailable), then every target and signature."""
    try:
        pkgutil.resolve_name(f"{LIBRARY}.get_symm_buffer_for_mega_moe")
    except Exception as error:
        return library_missing("Mega MoE path", LIBRARY, error, "SGLang's DeepGEMM (sgl-deep-gemm) with Mega MoE")
    return first_problem(adapter.targets())


class MegaMoEHooks:
    """One scheduler's hooks: each layer's R between its decision and its dispatch, the first fallback logged."""

    def __init__(self, session):
        self.session = session
        self.module = pkgutil.resolve_name(MODULE)
        self.get_parallel = pkgutil.resolve_name(PARALLEL.name)
        self.get_flags = pkgutil.resolve_name(adoption.GET_FLAGS.name)
        self.pending_runtime_tokens: dict[int, int] = {}  # id(experts) -> the R its decision saw
        self.sent: dict[int, local_batch.SentPairs] = {}  # id(experts) -> its scratch for the pairs sent
        self.fallback_logged = False

    # --- the hooks ---------------------------------------------------------------------------------

    def around_should_use(self, original, moe, hidden_states, *args, **kwargs):
        use = original(moe, hidden_states, *args, **kwargs)
        try:
            self.decided(moe, hidden_states, use)
        except Exception:  # the engine must not notice capwatch
            logger.exception("capwatch: a Mega MoE decision was not counted")
        return use

    def around_run(self, original, experts, hidden_states, topk_ids, topk_weights, *args, **kwargs):
        try:
            counted = self.before_run(experts, hidden_states, kwargs)
        except Exception:
            logger.exception("capwatch: a Mega MoE dispatch was not counted")
            counted = None
        output = original(experts, hidden_states, topk_ids, topk_weights, *args, **kwargs)
        if counted is not None:
            layer, runtime_tokens, local_tokens = counted
            if layer.step_leader:
                layer.counters.record_step(runtime_tokens, local_tokens)
            if layer.counts_traffic and topk_ids is not None:
                self.sent[id(experts)].count(topk_ids)
            layer.count_dispatch()
        return output

    def around_capture(self, original, *args, **kwargs):
        with self.session.capturing():
            return original(*args, **kwargs)

    # --- what they count -----------------------------------------------------------------------------

    def decided(self, moe, hidden_states, use: bool) -> None:
        """A step's decision: its R kept for the dispatch, or a fallback above the cap counted (on the step leader)."""
        module = self.module
        if module._use_amd_flydsl_mega_moe() or not module.get_moe_a2a_backend().is_megamoe() \
                or not module.is_mega_moe_experts_ready(moe.experts):
            return  # not DeepGEMM's Mega MoE: neither path is this cap's
        local_tokens = hidden_states.shape[0]
        global_num_tokens = module.get_dp_global_num_tokens()
        runtime_tokens = (max(global_num_tokens) if global_num_tokens and not module.is_dsa_enable_prefill_cp()
                          else local_tokens)
        layer = self.layer_of(moe.experts, moe.config.hidden_size, moe.config.num_experts_per_tok
                              + moe.num_fused_shared_experts, buffer=lambda: module._mega_moe_buffer(moe))
        if use:
            self.pending_runtime_tokens[id(moe.experts)] = runtime_tokens
            return
        if runtime_tokens <= layer.cap or module.get_is_capture_mode():
            return  # not a fallback for the cap
        if layer.step_leader:  # per step, as overflows: every MoE layer falls back alike
            layer.counters.record_step(runtime_tokens, local_tokens)
            counts = self.session.roles[layer.counters.role].backend_counts
            counts[FALLBACK_STEPS] = counts.get(FALLBACK_STEPS, 0) + 1
            if not self.fallback_logged:
                self.fallback_logged = True
                reported = self.session.roles[layer.counters.role].reported.get(NAME)
                logger.warning("capwatch: %s", fallback_line(runtime_tokens, layer.cap, layer.ep_rank, layer.ep_size,
                                                             None if reported is None else reported.buffer_bytes))

    def before_run(self, experts, hidden_states, kwargs):
        """The dispatch's layer, R and local batch; an overflow (the batch above the cap) counted and reported."""
        local_tokens = kwargs["num_tokens"]
        layer = self.layer_of(experts, kwargs["hidden_size"], kwargs["top_k"],
                              buffer=lambda: self.run_buffer(experts, kwargs))
        runtime_tokens = max(self.pending_runtime_tokens.pop(id(experts), local_tokens), local_tokens)
        if local_tokens > layer.cap:
            adoption.count_overflow(layer, local_tokens)  # SGLang's assertion then ends the rank
            return None
        return layer, runtime_tokens, local_tokens

    def run_buffer(self, experts, kwargs):
        """The buffer run_mega_routed_experts is about to ask for, asked with its arguments (cached by SGLang)."""
        module = self.module
        return module._get_mega_moe_symm_buffer(
            self.get_parallel().moe_ep_group.device_group, num_experts=experts.num_experts,
            num_max_tokens_per_rank=getattr(module.envs, MEGAMOE.cap_env_var).get(), num_topk=kwargs["top_k"],
            hidden=kwargs["hidden_size"], intermediate_hidden=kwargs["intermediate_size"],
            num_shared_experts=kwargs.get("num_shared_experts", 0), mma_type=module._mega_moe_mma_type(experts),
            activation=kwargs.get("activation", "swiglu"))

    # --- adoption, at a layer's first call --------------------------------------------------------------

    def layer_of(self, experts, hidden_size: int, top_k: int, buffer):
        layer = self.session.layer_of(experts)
        if layer is not None:
            return layer
        group = self.get_parallel().moe_ep_group.device_group
        cap = getattr(self.module.envs, MEGAMOE.cap_env_var).get()
        counted = local_batch.Counted(cap=cap, ep_rank=group.rank(), ep_size=group.size(), hidden_size=hidden_size,
                                      top_k=top_k, num_experts=experts.num_experts)
        # Adopted at its first call: a draft model's layer runs in SGLang's speculative context (the flag the
        # dispatcher hooks read at construction), where SGLang sets it around the draft's forward.
        role = "draft" if self.get_flags().moe.speculative_context else "target"
        layer = local_batch.count_layer(self.session, experts, counted, MEGAMOE, role,
                                        getattr(experts, "layer_id", None), lead_per_micro_batch=False)
        self.sent[id(experts)] = local_batch.SentPairs.made(layer, cap, top_k)
        watch = self.session.roles[role]
        if not watch.reported:
            built = buffer()
            buffer_bytes = int(built.buffer.nbytes)
            watch.reported = local_batch.reported(self.session, role, MEGAMOE, built, buffer_bytes,
                                                  ReportedBuffer(buffer_bytes=buffer_bytes, dispatch_format="fp8"))
        self.session.start_role_once(role)
        return layer


def fallback_line(runtime_tokens: int, cap: int, ep_rank: int, ep_size: int, buffer_bytes: int | None) -> str:
    """The one line the first fallback of a process logs (SGLang logs nothing): what happened, what stops it and
    what that costs (the buffer's reported bytes in proportion to the cap: an estimate)."""
    raised = suggested_cap(runtime_tokens, MEGAMOE.alignment)
    price = ("a larger symmetric buffer" if buffer_bytes is None else
             f"the symmetric buffer grows from {format_bytes(buffer_bytes)} to about "
             f"{format_bytes(ReportedPricing(ep_size, cap, buffer_bytes).bytes_per_rank(raised))} per rank")
    return (f"a Mega MoE step fell back to the slower non-mega MoE path: R = {runtime_tokens} tokens per rank is "
            f"above the cap {cap}, so SGLang skipped DeepGEMM's Mega MoE (no error; the step ran, slower). "
            f"Set {MEGAMOE.env_line(raised)} (or more) to stop the fallback: {price}, memory traded for speed (no "
            f"rank is at risk); further fallbacks are counted in moe_a2a_{NAME}_{FALLBACK_STEPS}_total, not logged. "
            f"[target, EP rank {ep_rank}/{ep_size}]")


def register(session, adapter: Adapter, source) -> None:
    """Hook the decision, the dispatch and the graph captures."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = MegaMoEHooks(session)
    HookRegistry.register(SHOULD_USE.name, hooks.around_should_use, HookType.AROUND, source=source)
    HookRegistry.register(RUN.name, hooks.around_run, HookType.AROUND, source=source)
    for target in CAPTURE_TARGETS:
        HookRegistry.register(target.name, hooks.around_capture, HookType.AROUND, source=source)
