"""FlashInfer's MoE A2A in SGLang (``--moe-a2a-backend flashinfer``): what the plugin hooks, per release.

After SGLang constructs a ``FlashinferDispatcher`` (a ``HookRegistry`` hook on ``__init__``) the plugin adopts it:
each ``MoeAlltoAll`` it holds keeps its workspace and methods, and its ``dispatch`` is shadowed by an instance
attribute that counts through its layer's ``LayerCounting`` (``dispatcher/counting.py``, the workspace's counter
words as its way in); SGLang's own ``dispatch`` is left alone. No allocation, no host sync. An overflow is counted
where the scheduler dies of SGLang's assert (the hook on ``get_exception_traceback``), or under ``python -O`` by
capwatch's guard before FlashInfer writes. What differs between the releases is the :class:`Adapter`; the hot path,
the overflows and the per-release table: docs/sglang.md ("Supported releases", "What it does").
"""

from __future__ import annotations

import inspect
import logging
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

from capwatch.dispatcher.counting import TRAFFIC_SAMPLE_STRIDE, CapOverflowError, CounterWords
from capwatch.dispatcher.flashinfer_backend import FlashInferMoeAlltoAllBackend
from capwatch.sglang_engine.caps import bind, reported_backend
from capwatch.sglang_plugin.floors import flashinfer as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.releases import CAPTURE_TARGETS, Target, first_problem, installed_version
from capwatch.sglang_plugin.status import BackendUnavailable
from capwatch.sizing.flashinfer_releases import FLASHINFER as FLASHINFER_RULES
from capwatch.sizing.flashinfer_releases import MOE_ALLTOALL_REMOVED_IN, lacks_moe_alltoall

FLASHINFER = bind(FLASHINFER_RULES)  # with SGLang's variable and default for its cap

logger = logging.getLogger("capwatch.sglang")

NAME = "flashinfer"  # --moe-a2a-backend
PACKAGE = "flashinfer-python"  # its library's distribution: the release problem() checks and the plugin info reports
MODULE = "sglang.srt.layers.moe.token_dispatcher.flashinfer"
DISPATCHER = f"{MODULE}.FlashinferDispatcher"
INIT = f"{DISPATCHER}.__init__"
DISPATCH = Target(f"{DISPATCHER}.dispatch", ("hidden_states", "topk_output"))
# FlashInfer's, shadowed per object by the counting dispatch, which passes these positionally.
ALLTOALL_DISPATCH = Target("flashinfer.comm.MoeAlltoAll.dispatch", (
    "token_selected_experts", "input_payloads", "runtime_max_tokens_per_rank", "invalid_token_expert_id",
    "expert_id_payload_index"))
# run_scheduler_process's except block formats the fatal exception with it (imported from sglang.utils).
EXCEPTION_TRACEBACK = Target("sglang.utils.get_exception_traceback")
CREATE_DISPATCHER = Target("sglang.srt.layers.moe.fused_moe_triton.layer.create_moe_dispatcher",
                           ("moe_runner_config", "quant_method"))
# What the hooks read off the dispatcher module in every release: R as SGLang computes it.
MODULE_NAMES = ("_max_tokens_per_scattered_source", "get_dp_global_num_tokens", "get_parallel", "get_flags")
BASE_INIT = ("group", "router_topk", "num_experts", "num_local_experts", "hidden_size", "params_dtype")
NAMESPACE_ROLES = {"DECODE": "target", "SPECULATIVE": "draft", "SP_PREFILL": "sp_prefill"}


# --- how each release tells its workspaces apart, and which one a dispatch is using ----------------

def _roles_by_flag(module, dispatcher) -> list[tuple[str, str]]:
    """0.5.19 - 0.5.22: one MoeAlltoAll, SPECULATIVE (+128 B) while SGLang builds a draft model's layers."""
    return [("moe_a2a", "draft" if module.get_flags().moe.speculative_context else "target")]


def _roles_by_namespace(module, dispatcher) -> list[tuple[str, str]]:
    """0.5.23: ``decode_a2a_namespace`` (DECODE or SPECULATIVE), and SP_PREFILL when enabled."""
    roles = [("moe_a2a", NAMESPACE_ROLES[dispatcher.decode_a2a_namespace.name])]
    if dispatcher.sp_prefill_moe_a2a is not None:
        roles.append(("sp_prefill_moe_a2a", "sp_prefill"))
    return roles


def _active_decode(module, dispatcher) -> str:
    return "moe_a2a"


def _active_decode_or_sp(module, dispatcher) -> str:
    """0.5.23's choice in ``dispatch``: an extend batch with SP active uses the SP-prefill workspace."""
    return "sp_prefill_moe_a2a" if module.get_is_extend_in_batch() and module.get_forward().sp_active else "moe_a2a"


@dataclass(frozen=True)
class Adapter:
    """How one family of SGLang releases builds and drives ``FlashinferDispatcher``."""

    releases: tuple[str, ...]
    flashinfer: tuple[str, ...]  # SGLang's FlashInfer pin, then its hot-fix releases
    init_parameters: tuple[str, ...]
    module_names: tuple[str, ...]
    prefill: str  # where extend batches go, in words (docs, tests)
    roles: Callable  # (module, dispatcher) -> [(attribute, role)]: the MoeAlltoAll objects it holds
    active: Callable  # (module, dispatcher) -> the attribute of the MoeAlltoAll a dispatch uses now
    layer_id_at_create: bool = False  # the layer id reaches only create_moe_dispatcher (0.5.22)

    def targets(self) -> tuple[Target, ...]:
        create = (CREATE_DISPATCHER,) if self.layer_id_at_create else ()
        return (Target(INIT, self.init_parameters), DISPATCH, ALLTOALL_DISPATCH, EXCEPTION_TRACEBACK, *create,
                *CAPTURE_TARGETS)


ALL_GATHER_PREFILL = Adapter(
    releases=("0.5.19", "0.5.20", "0.5.21"), flashinfer=("0.6.18", "0.6.18.post1"),
    init_parameters=(*BASE_INIT, "moe_runner_config"),
    module_names=(*MODULE_NAMES, "get_is_extend_in_batch"),
    prefill="all-gather (not through the A2A, not counted)",
    roles=_roles_by_flag, active=_active_decode)
A2A_PREFILL = Adapter(
    releases=("0.5.22",), flashinfer=("0.7.1",), init_parameters=BASE_INIT, module_names=MODULE_NAMES,
    prefill="through the A2A (counted with decode, role target/draft)",
    roles=_roles_by_flag, active=_active_decode, layer_id_at_create=True)
SP_PREFILL = Adapter(
    releases=("0.5.23",), flashinfer=("0.7.2", "0.7.2.post1"),
    init_parameters=(*BASE_INIT, "moe_runner_config", "enable_sp_prefill_a2a"),
    module_names=(*MODULE_NAMES, "get_is_extend_in_batch", "get_forward", "_WorkspaceNamespace"),
    prefill="all-gather; SP prefill through its own A2A (counted, role sp_prefill)",
    roles=_roles_by_namespace, active=_active_decode_or_sp)

ADAPTERS = {release: adapter for adapter in (ALL_GATHER_PREFILL, A2A_PREFILL, SP_PREFILL)
            for release in adapter.releases}
KNOWN_FLASHINFER = tuple(dict.fromkeys(v for adapter in ADAPTERS.values() for v in adapter.flashinfer))


def problem(adapter: Adapter, flashinfer_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why this backend cannot be instrumented with ``adapter``, or None: first whether SGLang can build its
    dispatcher at all (:func:`unavailable`), then FlashInfer's version (a newer SGLang still needs a FlashInfer whose
    MoeAlltoAll capwatch knows), then every target and signature."""
    found = unavailable(adapter, flashinfer_version)
    if found is not None:
        return found
    accepted = KNOWN_FLASHINFER if newer else adapter.flashinfer
    if flashinfer_version not in accepted:
        beside = "a newer sglang" if newer else f"sglang {adapter.releases[0]}" + (
            f" - {adapter.releases[-1]}" if len(adapter.releases) > 1 else "")
        return (f"flashinfer-python {flashinfer_version} is not supported beside {beside} "
                f"(capwatch knows {', '.join(accepted)})")
    found = first_problem(adapter.targets())
    if found is not None:
        return found
    module = pkgutil.resolve_name(MODULE)
    missing = [name for name in adapter.module_names if not hasattr(module, name)]
    if missing:
        return f"{MODULE} lacks {', '.join(missing)}"
    return None


def unavailable(adapter: Adapter, flashinfer_version: str | None) -> BackendUnavailable | None:
    """SGLang's own ``FlashinferDispatcher`` cannot be built here, or None: its module could not import FlashInfer's
    MoE A2A (``use_flashinfer`` False), so its constructor raises ImportError when SGLang builds the model, with or
    without capwatch. Every release up to 0.5.23 imports ``flashinfer.comm.MoeAlltoAll``, which flashinfer 0.7.4
    removed; a FlashInfer that is missing or fails to import ends the same way."""
    try:
        module = pkgutil.resolve_name(MODULE)
    except Exception:  # noqa: BLE001 - the target checks name what failed
        return None
    if getattr(module, "use_flashinfer", True):
        return None
    sglang = f"sglang {installed_version('sglang')}'s FlashinferDispatcher cannot be built"
    if flashinfer_version is None:
        installed = f"{sglang}: flashinfer-python is not installed"
    elif lacks_moe_alltoall(flashinfer_version):
        installed = (f"{sglang} with flashinfer-python {flashinfer_version}: it calls flashinfer.comm.MoeAlltoAll, "
                     f"which flashinfer {MOE_ALLTOALL_REMOVED_IN} removed (only flashinfer.moe_ep remains)")
    else:
        installed = (f"{sglang} with flashinfer-python {flashinfer_version}: {MODULE} could not import "
                     "flashinfer's MoE A2A (use_flashinfer is False; `python -c 'import flashinfer.comm'` in the "
                     "server's environment shows why)")
    return BackendUnavailable(installed, (
        f"install flashinfer-python {adapter.flashinfer[-1]} (what capwatch instruments beside sglang "
        f"{adapter.releases[-1]}: {', '.join(adapter.flashinfer)}) or pick another --moe-a2a-backend"))


# --- the hooks --------------------------------------------------------------------------------------

def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption) and the graph captures through SGLang's HookRegistry."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    module = pkgutil.resolve_name(MODULE)
    init_signature = inspect.signature(pkgutil.resolve_name(INIT))

    def around_init(original, dispatcher, *args, **kwargs):
        original(dispatcher, *args, **kwargs)
        try:
            runner_config = init_signature.bind(dispatcher, *args, **kwargs).arguments.get("moe_runner_config")
            adopt(session, adapter, module, dispatcher, getattr(runner_config, "layer_id", None))
        except Exception:
            logger.exception("capwatch: this dispatcher is not instrumented (adoption failed); it runs as SGLang's")

    def around_create(original, moe_runner_config, *args, **kwargs):
        dispatcher = original(moe_runner_config, *args, **kwargs)
        session.set_layer_id(dispatcher, getattr(moe_runner_config, "layer_id", None))
        return dispatcher

    def around_capture(original, *args, **kwargs):
        with session.capturing():
            return original(*args, **kwargs)

    def after_fatal_exception(result, *args, **kwargs):
        try:
            count_fatal_overflow(session, adapter, module, sys.exc_info()[1])
        except Exception:  # the scheduler is dying of its own error; capwatch's must not replace it
            logger.exception("capwatch: could not count the overflow behind SGLang's assert")
        return None

    HookRegistry.register(INIT, around_init, HookType.AROUND, source=source)
    HookRegistry.register(EXCEPTION_TRACEBACK.name, after_fatal_exception, HookType.AFTER, source=source)
    if adapter.layer_id_at_create:
        HookRegistry.register(CREATE_DISPATCHER.name, around_create, HookType.AROUND, source=source)
    for target in CAPTURE_TARGETS:
        HookRegistry.register(target.name, around_capture, HookType.AROUND, source=source)


def adopt(session, adapter: Adapter, module, dispatcher, layer_id: int | None) -> None:
    """Count each MoeAlltoAll the dispatcher holds: its own workspace, whose int32 counter words are the layer's way
    into the counters (no second workspace; nothing allocated but the counters and the layer's record, made now,
    at construction, before any graph capture)."""
    for attribute, role in adapter.roles(module, dispatcher):
        alltoall = getattr(dispatcher, attribute)
        backend = FlashInferMoeAlltoAllBackend.adopt(alltoall)
        geometry = dict(cap=dispatcher.max_num_tokens, ep_rank=backend.ep_rank, ep_size=backend.ep_size,
                        hidden_size=dispatcher.hidden_size, top_k=dispatcher.router_topk,
                        num_experts=dispatcher.num_experts)
        words = CounterWords(backend.traffic_counts())
        layer = session.count_layer(alltoall, dispatcher, role, layer_id, geometry, backend.device, FLASHINFER,
                                    traffic=lambda counters: words, traffic_stride=TRAFFIC_SAMPLE_STRIDE)
        session.roles[role].reported = dict(backend=reported_backend(FLASHINFER),
                                            flashinfer_version=session.versions["flashinfer"])
        session.count_buffer(role, alltoall.workspace.data_ptr(), int(alltoall.workspace_size_per_rank))
        alltoall.dispatch = _first_dispatch(session, alltoall, layer)


def unadopt(dispatcher) -> None:
    """SGLang's dispatcher exactly as shipped again (the benchmark's bare side)."""
    for attribute in ("moe_a2a", "sp_prefill_moe_a2a"):
        alltoall = getattr(dispatcher, attribute, None)
        if alltoall is not None:
            vars(alltoall).pop("dispatch", None)


def _first_dispatch(session, alltoall, layer):
    """The role's reports and series start at its first dispatch (every layer and workspace is known
    then); after it, the MoeAlltoAll's dispatch is the counting one, with no check left per call."""
    def first(*args, **kwargs):
        session.start_role_once(layer.counters.role)
        alltoall.dispatch = counted = layer.counted(type(alltoall).dispatch.__get__(alltoall))
        return counted(*args, **kwargs)
    return first


def runtime_tokens(module, local_tokens: int) -> int:
    """R exactly as SGLang's ``dispatch`` computes it (every verified release), from its own functions."""
    dp_global = module.get_dp_global_num_tokens()
    if dp_global is not None and len(dp_global) > 1:
        return module._max_tokens_per_scattered_source(dp_global, module.get_parallel().attn_tp_size)
    return local_tokens


def _dispatch_frame(error: BaseException, dispatch_code):
    """The frame of ``FlashinferDispatcher.dispatch`` the error came out of, or None."""
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code is dispatch_code:
            return traceback.tb_frame
        traceback = traceback.tb_next
    return None


def count_fatal_overflow(session, adapter: Adapter, module, error: BaseException | None) -> None:
    """An ``AssertionError`` out of SGLang's ``dispatch`` on R: counted, reported (bounded wait) and logged,
    never raised; SGLang's own error then ends the rank as it would without capwatch."""
    if not isinstance(error, AssertionError):
        return
    frame = _dispatch_frame(error, inspect.unwrap(module.FlashinferDispatcher.dispatch).__code__)
    if frame is None:
        return
    dispatcher, local_tokens = frame.f_locals["self"], frame.f_locals["hidden_states"].shape[0]
    layer = session.layer_of(getattr(dispatcher, adapter.active(module, dispatcher)))
    runtime = runtime_tokens(module, local_tokens)
    if layer is None or not (runtime > layer.cap or local_tokens > runtime):
        return
    try:
        layer.guard(runtime, local_tokens)
    except CapOverflowError as overflow:
        logger.error("capwatch: %s (counted and reported; SGLang's assert ends the rank)", overflow)
