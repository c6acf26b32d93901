"""``CAPWATCH_APPLY`` in SGLang's launcher: the advised cap set inside SGLang's own resolution of the server's
arguments, just before SGLang's own check of the cap, so that check runs on the applied value and every scheduler
SGLang spawns afterwards inherits it (docs/apply.md).

Where: just before SGLang's own start-up check of the cap, a step of its resolution that runs for every backend
once the speculative settings (which the floor needs) are final; the floor modules name it by release
(``START_CHECKS``):

- 0.5.20 - 0.5.23: SGLang's API, ``resolution_hooks.register_resolution_hook(step)`` (the step is whitelisted);
- 0.5.19 (no ``resolution_hooks``): ``run_resolution_pipeline`` imports the step from ``moe_hook`` when it runs, so
  an AROUND hook through SGLang's ``HookRegistry``, applied by the launcher's ``load_plugins()``, wraps it.

Resolution runs once, in the launcher (``resolve_once``; schedulers receive the resolved record): nothing is set in
a scheduler. Anything that goes wrong is one line and the server starts with the cap as it was set.
"""

from __future__ import annotations

import logging
import os
import time

from capwatch.sglang_plugin import releases
from capwatch.sglang_plugin.apply import advice as advice_source
from capwatch.sglang_plugin.apply import state
from capwatch.sglang_plugin.apply.applied import clear_applied, read_applied, record_applied
from capwatch.sglang_plugin.apply.decide import ModelShape, Outcome, Shape, decide, int_or_none
from capwatch.sglang_plugin.apply.settings import ApplySettings, ApplySettingsError, load_apply

logger = logging.getLogger("capwatch.sglang")

MOE_HOOK = "sglang.srt.arg_groups.moe_hook"  # where SGLang's resolution steps of the MoE settings live
SOURCE = "capwatch apply"  # the declaration source SGLang records for a lowered --mem-fraction-static
_installed = False


def install(environ=os.environ) -> None:
    """From ``register`` in every process that loads plugins: with ``CAPWATCH_APPLY`` other than off, wrap the
    release's resolution step (it runs only where SGLang resolves the arguments: the launcher)."""
    global _installed
    try:
        settings = load_apply(environ)
    except ApplySettingsError as error:
        logger.error("capwatch: apply: %s; nothing applied", error)
        return
    if settings.mode == "off" or _installed:
        return
    step, why_not = start_check_step(environ)
    if step is None:
        logger.warning("capwatch: apply: nothing applied: %s", why_not)
        return
    try:
        from sglang.srt.arg_groups import resolution_hooks
    except ImportError:  # 0.5.19
        resolution_hooks = None
    if step in getattr(resolution_hooks, "_OVERRIDABLE_HOOKS", ()):  # 0.5.20 on: SGLang's API
        resolution_hooks.register_resolution_hook(step)(in_resolution)
    else:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        target = releases.Target(f"{MOE_HOOK}.{step}", ("server_args",))
        problem = releases.target_problem(target)
        if problem is not None:
            logger.error("capwatch: apply: nothing applied: %s", problem)
            return
        HookRegistry.register(target.name, _around_legacy_step, HookType.AROUND)
    _installed = True


def start_check_step(environ) -> tuple[str | None, str | None]:
    """(the resolution step of SGLang's own start-up check of the cap in the installed release, None), the floor
    modules naming it (``START_CHECKS``); (None, why) where capwatch does not run on the release."""
    from capwatch.agent.switch import switch
    from capwatch.sglang_plugin.hooks import FLOORS

    try:
        allow_newer = switch(environ, "CAPWATCH_ALLOW_NEWER_SGLANG", default=False)
    except ValueError as error:
        return None, str(error)
    choice = releases.choose(releases.installed_version("sglang"), allow_newer)
    if isinstance(choice, str):
        return None, choice
    steps = [module.START_CHECKS[choice.adapter] for module in FLOORS.values() if hasattr(module, "START_CHECKS")]
    return (steps[0], None) if steps else (None, "no floor module names SGLang's start-up check of the cap")


def _around_legacy_step(original, server_args, *args, **kwargs):
    in_resolution(server_args, lambda resolved: original(resolved, *args, **kwargs))


def in_resolution(server_args, previous) -> None:
    """The resolution step's wrapper: apply, then SGLang's own step (its check of the cap). Should SGLang refuse
    the applied value, the variable is restored and its step runs again on what the operator had."""
    changed = None
    try:
        changed = apply_at_start(server_args)
    except Exception as error:  # capwatch never stops a server from starting: one line (the traceback at debug)
        logger.error("capwatch: apply: failed (%s: %s); SGLang starts with the cap as it was set",
                     type(error).__name__, str(error).splitlines()[0][:300] if str(error) else "")
        logger.debug("capwatch: apply: the failure", exc_info=True)
    if changed is None:
        previous(server_args)
        return
    try:
        previous(server_args)
    except ValueError as error:
        variable, before = changed
        _restore(variable, before)
        logger.error("capwatch: apply: SGLang refused the applied cap (%s); %s restored to %s",
                     str(error).splitlines()[0][:300], variable, "unset" if before is None else before)
        previous(server_args)


def _restore(variable: str, before: str | None) -> None:
    if before is None:
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = before
    clear_applied(variable)


def apply_at_start(server_args, now: float | None = None) -> tuple[str, str | None] | None:
    """Decide and act for this server's cap; returns (variable, its value before) where it set one."""
    from capwatch.sglang_plugin.settings import SettingsError, load

    try:
        plugin = load()  # every CAPWATCH_* setting, CAPWATCH_APPLY's among them
    except SettingsError as error:
        logger.error("capwatch: apply: not applied: %s", error)
        return None
    settings = plugin.apply
    if settings.mode == "off":
        return None
    from sglang.srt.arg_groups.model_override_base import resolved_view

    head = f"capwatch: apply (CAPWATCH_APPLY={settings.mode}): "
    view = resolved_view(server_args)
    if getattr(view, "use_ray", False):
        logger.warning("%srefused under Ray (--use-ray): SGLang's Ray actors get neither the plugins nor the "
                       "launcher's environment, so ranks could build different caps; nothing changed", head)
        return None
    found = _shape(server_args, view, settings)
    if isinstance(found, str):
        logger.warning("%snot applied: %s; nothing changed", head, found)
        return None
    shape = found
    variable = shape.rules.cap_env_var
    inherited = read_applied(variable)
    if inherited is not None and inherited.source == "capwatch" and os.environ.get(variable) == str(inherited.cap):
        logger.debug("capwatch: apply: %s=%s was applied by this server's launcher (revision %s)", variable,
                     inherited.cap, inherited.revision)
        return None
    clear_applied(variable)
    operator_value = os.environ.get(variable)
    advice, problem = None, None
    try:
        if settings.advice_file is not None:
            advice = advice_source.from_file(settings.advice_file, plugin.cluster)
        elif plugin.service_url is not None:
            advice = advice_source.from_service(plugin.service_url, plugin.cluster, plugin.token, settings.wait_s)
        else:
            problem = "no advice: set CAPWATCH_ADVICE_FILE, or CAPWATCH_SERVICE_URL and CAPWATCH_CLUSTER"
    except advice_source.AdviceUnavailable as error:
        problem = str(error)
    overflow = None
    try:
        overflow = state.blocking(settings.state_path(), variable)
    except (OSError, ValueError) as error:
        advice, problem = None, f"the overflow record {settings.state_path()} cannot be read ({error})"
    outcome = decide(settings, shape, operator_value, advice, problem, overflow,
                     time.time() if now is None else now)
    return _act(server_args, settings, shape, outcome, operator_value)


def set_cap(envs, variable: str, cap: int) -> None:
    """Sets ``variable`` to ``cap`` where SGLang reads it: through its environment API (``envs.X.set``, os.environ
    underneath) where ``envs`` has the variable, else in os.environ (a cap SGLang reads raw, as Mooncake EP's)."""
    field = getattr(envs, variable, None)
    if field is not None:
        field.set(cap)
    else:
        os.environ[variable] = str(cap)


def _act(server_args, settings: ApplySettings, shape: Shape, outcome: Outcome,
         operator_value: str | None) -> tuple[str, str | None] | None:
    from sglang.srt.environ import envs

    variable = shape.rules.cap_env_var
    (logger.info if outcome.cap is not None or not settings.applies else logger.warning)(outcome.line)
    if not settings.applies:
        return None  # dry-run: the line, nothing else
    if outcome.cap is None:
        kept = int_or_none(operator_value)
        record_applied(variable, kept if kept is not None and kept > 0 else None, outcome.source, None, outcome.line)
        return None
    set_cap(envs, variable, outcome.cap)
    if outcome.mem_fraction_static is not None:
        from sglang.srt.arg_groups.overrides import declare_resolution

        declare_resolution(server_args, SOURCE, mem_fraction_static=outcome.mem_fraction_static)
    record_applied(variable, outcome.cap, "capwatch", outcome.revision, outcome.line)
    return variable, operator_value


def _shape(server_args, view, settings: ApplySettings) -> Shape | str:
    """The resolved server as the advice must match it, or why nothing applies to it."""
    from capwatch.advisor.floor import deployment_floor
    from capwatch.backends import SPECS
    from capwatch.agent.switch import switch
    from capwatch.sglang_plugin.hooks import FLOORS

    backend = str(view.moe_a2a_backend)
    applies = [name for name, module in FLOORS.items() if hasattr(module, "cap_params")]  # a floor module's opt-in
    if backend not in applies:
        return f"--moe-a2a-backend is {backend!r}; capwatch applies the caps of {', '.join(map(repr, applies))}"
    spec, floor_module = SPECS[backend], FLOORS[backend]
    params = floor_module.cap_params(view)
    if isinstance(params, str):
        return params
    version = releases.installed_version("sglang")
    try:
        allow_newer = switch(os.environ, "CAPWATCH_ALLOW_NEWER_SGLANG", default=False)
    except ValueError as error:
        return str(error)
    choice = releases.choose(version, allow_newer)
    if isinstance(choice, str):
        return choice
    problem = releases.first_problem(floor_module.targets(choice.adapter))
    if problem is not None:
        return problem
    limits = floor_module.limits(server_args, version, choice.adapter)
    floor = deployment_floor(limits, None, rules=spec.rules, prefill_dispatched=spec.prefill_dispatched(params))
    return Shape(spec.rules, int(view.ep_size), floor, mem_fraction_static=view.mem_fraction_static,
                 gpu_memory_bytes=_gpu_memory_bytes(view) if settings.lower_mem_fraction else None,
                 model=_model_shape(server_args, view))


# config.json's names for the routed experts and the experts per token, by model family (the first present counts).
ROUTED_EXPERTS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk", "num_experts_per_token")


def _model_shape(server_args, view) -> ModelShape | None:
    """The model's MoE geometry from SGLang's own ``ModelConfig`` (``model_config_of``: built once per record and
    kept, as SGLang's resolution builds it); None where the config does not say."""
    from sglang.srt.arg_groups.model_override_base import model_config_of

    try:
        model_config = model_config_of(server_args)
    except Exception as error:  # noqa: BLE001 - a config SGLang cannot read: no model shape (the refusal says so)
        logger.debug("capwatch: apply: the model's config (%s)", error)
        return None
    config = model_config.hf_text_config

    def first(names: tuple[str, ...]) -> int | None:
        found = [getattr(config, name, None) for name in names]
        return next((int(value) for value in found if isinstance(value, int) and value > 0), None)

    hidden_size, experts, top_k = getattr(model_config, "hidden_size", None), first(ROUTED_EXPERTS), \
        first(EXPERTS_PER_TOKEN)
    if not isinstance(hidden_size, int) or experts is None or top_k is None:
        return None
    return ModelShape(hidden_size, experts, top_k, shared_experts=int(getattr(config, "n_shared_experts", 0) or 0),
                      redundant_experts=int(getattr(view, "ep_num_redundant_experts", 0) or 0))


def _gpu_memory_bytes(view) -> int | None:
    """The GPU's memory as SGLang's memory settings read it (MiB there)."""
    from sglang.srt.utils.common import get_device_memory_capacity

    mebibytes = get_device_memory_capacity(view.device)
    return None if mebibytes is None else int(mebibytes * 2**20)
