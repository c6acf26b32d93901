"""The hooks, registered through SGLang's ``HookRegistry``; each one closes over this process's state.

``install`` (every process that loads plugins) hooks only ``runtime_context.publish``. When a
scheduler publishes, the plugin reads its settings and checks the versions and the hook targets;
on success it hooks the dispatcher's construction and dispatch and the graph captures. On any
problem it logs one line, serves ``capwatch_sglang_plugin_info`` saying why, and hooks nothing else:
SGLang runs as without it.
"""

from __future__ import annotations

import atexit
import inspect
import logging

from capwatch.dispatcher.instrumented import CapOverflowError
from capwatch.sglang_plugin import compat
from capwatch.sglang_plugin.adopted import InstrumentedMoeAlltoAll as _Adopted
from capwatch.sglang_plugin.limits import sglang_limits
from capwatch.sglang_plugin.session import SchedulerSession
from capwatch.sglang_plugin.settings import PluginSettings, SettingsError, load

logger = logging.getLogger("capwatch.sglang")

SCHEDULER_ROLE = "scheduler"


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        compat.pkgutil.resolve_name(compat.PUBLISH)
    except Exception as error:
        logger.error("capwatch: disabled: hook target %s is not there (%s); SGLang runs without capwatch",
                     compat.PUBLISH, error)
        return
    HookRegistry.register(compat.PUBLISH, _after_publish, HookType.AFTER)


def _after_publish(result, server_args, *args, role=None, ranks=None, **kwargs):
    if role != SCHEDULER_ROLE:
        return None
    try:
        start_scheduler(server_args, getattr(ranks, "gpu_id", None))
    except Exception:  # capwatch must never stop a scheduler from starting
        logger.exception("capwatch: disabled: the plugin failed to start; SGLang runs without capwatch")
    return None


def start_scheduler(server_args, gpu_id: int | None) -> SchedulerSession | None:
    versions = compat.versions()
    local_gpu_index = gpu_id or 0
    try:
        settings = load()
    except SettingsError as error:
        logger.error("capwatch: disabled: %s; SGLang runs without capwatch", error)
        return None
    reason = compat.unsupported_reason(versions) or compat.moved_target_reason()
    if reason is None and server_args.moe_a2a_backend != "flashinfer":
        reason = f"--moe-a2a-backend is {server_args.moe_a2a_backend!r}, not 'flashinfer': nothing to instrument"
    if reason is not None:
        where = _serve_status(settings, versions, local_gpu_index, reason)
        logger.warning("capwatch: disabled: %s; SGLang runs without capwatch (%s)", reason, where)
        return None
    session = SchedulerSession(settings, versions, sglang_limits(server_args, versions["sglang"]), local_gpu_index)
    atexit.register(session.close)
    register_hooks(session)
    return session


def _serve_status(settings: PluginSettings, versions, local_gpu_index: int, reason: str) -> str:
    """Serve the info metric alone; says where, for the one log line."""
    try:
        session = SchedulerSession(settings, versions, None, local_gpu_index, state="disabled", reason=reason)
    except OSError as error:
        return f"no info metric: {error}"
    atexit.register(session.close)
    return f"info metric on {session.exporter.url}"


def register_hooks(session: SchedulerSession) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    source = HookSource(plugin_name="capwatch", dist_name="a2a-capwatch")  # outside load_plugins' own context

    module = compat.pkgutil.resolve_name(compat.DISPATCHER_MODULE)
    init_signature = inspect.signature(compat.pkgutil.resolve_name(compat.DISPATCHER_INIT))

    def around_init(original, dispatcher, *args, **kwargs):
        original(dispatcher, *args, **kwargs)
        try:
            bound = init_signature.bind(dispatcher, *args, **kwargs)
            runner_config = bound.arguments.get("moe_runner_config")
            session.adopt(dispatcher, getattr(runner_config, "layer_id", None))
        except Exception:
            logger.exception("capwatch: this dispatcher is not instrumented (adoption failed); it runs as SGLang's")

    def around_dispatch(original, dispatcher, hidden_states, topk_output):
        moe_a2a = dispatcher.moe_a2a
        if type(moe_a2a) is not _Adopted:  # not adopted: SGLang's own dispatch
            return original(dispatcher, hidden_states, topk_output)
        # R as SGLang's dispatch computes it, from the same functions, before its asserts.
        is_extend = module.get_is_extend_in_batch()
        if is_extend:
            if not module.get_forward().sp_active:
                return original(dispatcher, hidden_states, topk_output)  # all-gather prefill: no A2A
            moe_a2a = dispatcher.sp_prefill_moe_a2a
            if type(moe_a2a) is not _Adopted:
                return original(dispatcher, hidden_states, topk_output)
        instrumented = moe_a2a.instrumented
        watch = session.roles[instrumented.counters.role]
        if not watch.started:
            watch.started = True
            try:
                session.start_role(watch)
            except Exception:  # the counters keep counting; SGLang must not notice
                logger.exception("capwatch: the %s role's reports and series did not start", watch.role)
        dp_global = module.get_dp_global_num_tokens()
        local_tokens = hidden_states.shape[0]
        if dp_global is not None and len(dp_global) > 1:
            runtime_tokens = module._max_tokens_per_scattered_source(dp_global, module.get_parallel().attn_tp_size)
        else:
            runtime_tokens = local_tokens
        if runtime_tokens > instrumented.cap or local_tokens > runtime_tokens:
            try:
                instrumented.guard(runtime_tokens, local_tokens)  # counts it, ships the final report, raises
            except CapOverflowError:
                if __debug__:
                    # SGLang's own assert ends the rank, as it would without capwatch.
                    original(dispatcher, hidden_states, topk_output)
                raise  # python -O: SGLang's asserts are gone; capwatch's error ends the rank
        return original(dispatcher, hidden_states, topk_output)

    def around_capture(original, *args, **kwargs):
        with session.capturing():
            return original(*args, **kwargs)

    HookRegistry.register(compat.DISPATCHER_INIT, around_init, HookType.AROUND, source=source)
    HookRegistry.register(compat.DISPATCH, around_dispatch, HookType.AROUND, source=source)
    for target in compat.CAPTURE_TARGETS:
        HookRegistry.register(target, around_capture, HookType.AROUND, source=source)
    HookRegistry.apply_hooks()

