"""The start hook, registered through SGLang's ``HookRegistry``; the rest closes over one scheduler's session.

``install`` (every process that loads plugins) hooks only ``configure_scheduler_process`` (after it
returns), and only where SGLang's scheduler module is loaded: the start hook then runs in each scheduler
process with its GPU index, after ``publish`` and before the model is built. There the plugin reads its
settings, picks the adapters of the installed release (``releases.py``) and of ``--moe-a2a-backend``
(``hooks/``, each naming its ``floors/`` module), checks every target and signature they rely on, starts the
exporter and hooks the backend, in a session of the rank agent (``agent/session.py``). On any problem it logs one
line, serves ``capwatch_sglang_plugin_info`` saying why, and hooks nothing else: SGLang runs as without it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

from capwatch.agent.session import RankSession
from capwatch.backends import spec_of
from capwatch.sglang_engine.limits import cap_source_text, report_fields
from capwatch.sglang_plugin import releases
from capwatch.sglang_plugin.apply import overflows
from capwatch.sglang_plugin.hooks import BACKENDS
from capwatch.sglang_plugin.settings import PluginSettings, SettingsError, load
from capwatch.sglang_plugin.start_check import check_cap_at_start
from capwatch.sglang_plugin.status import ENABLED, BackendUnavailable, plugin_status, state_of

logger = logging.getLogger("capwatch.sglang")

START = releases.Target(releases.START_HOOK, releases.START_PARAMETERS)


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if releases.SCHEDULER_MODULE not in sys.modules:
        return  # the engine front end, the detokenizer: no scheduler runs here, and its module is heavy
    problem = releases.target_problem(START)
    if problem is not None:
        logger.error("capwatch: disabled: %s; SGLang runs without capwatch", problem)
        return
    HookRegistry.register(releases.START_HOOK, _after_configure, HookType.AFTER)


def _after_configure(result, server_args, gpu_id, *args, **kwargs):
    try:
        start_scheduler(server_args, gpu_id)
    except Exception:  # capwatch must never stop a scheduler from starting
        logger.exception("capwatch: disabled: the plugin failed to start; SGLang runs without capwatch")
    return None  # configure_scheduler_process's own result stands


def versions() -> dict[str, str | None]:
    """SGLang's release and the release of each backend's own library (a hook module's ``PACKAGE``), by name: what
    a backend's ``problem`` checks and the plugin info's ``<name>_version`` labels."""
    return {"sglang": releases.installed_version("sglang"),
            **{name: releases.installed_version(module.PACKAGE) for name, module in BACKENDS.items()
               if getattr(module, "PACKAGE", None)}}


def start_scheduler(server_args, gpu_id: int | None) -> RankSession | None:
    found = versions()
    local_gpu_index = gpu_id or 0
    try:
        settings = load()
    except SettingsError as error:
        logger.error("capwatch: disabled: %s; SGLang runs without capwatch", error)
        return None
    choice = releases.choose(found["sglang"], settings.allow_newer_sglang)
    reason = choice if isinstance(choice, str) else None
    backend = BACKENDS.get(server_args.moe_a2a_backend)
    if reason is None and backend is None:
        reason = (f"--moe-a2a-backend is {server_args.moe_a2a_backend!r}; capwatch instruments "
                  f"{', '.join(repr(name) for name in BACKENDS)}: nothing to instrument")
    if reason is None and choice.adapter not in backend.ADAPTERS:
        why = getattr(backend, "UNSUPPORTED", {}).get(choice.adapter)  # what differs there, where known
        reason = (f"capwatch's {backend.NAME} hooks are verified on sglang {', '.join(backend.ADAPTERS)}, not "
                  f"{choice.adapter}" + (f": {why}" if why else ""))
    if reason is None:
        adapter, floor = backend.ADAPTERS[choice.adapter], backend.FLOOR
        reason = backend.problem(adapter, found.get(backend.NAME), choice.newer) \
            or releases.first_problem(floor.targets(choice.adapter))
    if isinstance(reason, BackendUnavailable):  # SGLang cannot build the backend: not capwatch's to fix
        where = _serve_status(settings, found, local_gpu_index, reason)
        logger.error("capwatch: backend unavailable: %s; capwatch hooks nothing, and SGLang's own dispatcher raises "
                     "when it builds the model (%s)", reason, where)
        return None
    if reason is not None:
        where = _serve_status(settings, found, local_gpu_index, reason)
        logger.warning("capwatch: disabled: %s; SGLang runs without capwatch (%s)", reason, where)
        return None
    limits = floor.limits(server_args, found["sglang"], choice.adapter)
    try:
        session = RankSession(settings, plugin_status(ENABLED, "", found), found, report_fields(limits),
                              local_gpu_index)
    except OSError as error:  # the port is taken (another scheduler, another exporter): one line, no traceback
        logger.error("capwatch: disabled: %s (CAPWATCH_METRICS_BASE_PORT=%d + GPU %d); SGLang runs without capwatch",
                     error.strerror or error, settings.metrics_base_port, local_gpu_index)
        return None
    atexit.register(session.close)
    session.layer_watchers.append(overflows.watch)  # an overflow at a cap capwatch applied blocks it later
    rules = spec_of(backend.NAME).rules
    _check_cap_at_start(session, limits, rules, getattr(backend, "cap_at_start", None))
    _register(session, backend, adapter)
    logger.info("capwatch: enabled on %s (%s backend, GPU %d); /metrics on %s; its cap: %s", choice.describe(),
                backend.NAME, local_gpu_index, session.exporter.url,
                cap_source_text(limits.cap_source, limits.advice_revision, rules.cap_env_var))
    return session


def _check_cap_at_start(session: RankSession, limits, rules, resolved_cap=None) -> None:
    """The start-up check SGLang lacks (``start_check.py``), on the cap the dispatchers will read, served beside
    the info metric. ``resolved_cap()``: the backend's own resolution of its cap, where SGLang derives it when the
    variable is unset or 0 (a hook module's ``cap_at_start``: (cap, where it comes from))."""
    from sglang.srt.environ import envs

    if rules.below_floor is None:
        return
    try:
        if resolved_cap is not None:
            cap = resolved_cap()[0]
        elif hasattr(envs, rules.cap_env_var):
            cap = getattr(envs, rules.cap_env_var).get()
        else:  # read raw by its dispatcher (Mooncake EP: get_int_env_var(variable, default))
            raw = os.environ.get(rules.cap_env_var)
            cap = rules.default_cap if raw is None else int(raw)
    except Exception as error:  # the dispatcher will say so itself; the check has no cap to compare
        logger.warning("capwatch: at start: %s cannot be read (%s): the cap is not checked", rules.cap_env_var, error)
        return
    if cap is None:
        return
    collector = check_cap_at_start(cap, limits, rules)
    if collector is not None:
        session.exporter.registry.register(collector)


def _serve_status(settings: PluginSettings, found, local_gpu_index: int, reason: str | BackendUnavailable) -> str:
    """Serve the info metric alone; says where, for the one log line."""
    try:
        session = RankSession(settings, plugin_status(state_of(reason), str(reason), found), found, report_fields(None),
                              local_gpu_index)
    except OSError as error:
        return f"no info metric: {error}"
    atexit.register(session.close)
    return f"info metric on {session.exporter.url}"


def _register(session: RankSession, backend, adapter) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource

    source = HookSource(plugin_name="capwatch", dist_name="a2a-capwatch")  # outside load_plugins' own context
    backend.register(session, adapter, source)
    HookRegistry.apply_hooks()
