"""Adopting an SGLang dispatcher instance, as every hook of a per-instance dispatcher shares it (DeepEP, MoRI, and
the backends counted through ``local_batch.py``); SGLang's classes are left alone.

- ``register``: a ``HookRegistry`` hook around the dispatcher's ``__init__`` adopts each one SGLang constructs,
  with its role (``"draft"`` in SGLang's speculative context, else ``"target"``) and the layer id
  ``create_moe_dispatcher`` is building; graph captures pause the session's snapshots;
- ``count_layer``: the adopted dispatcher as one layer in its role's counters, on this process's device;
- ``count_from_first_dispatch``: the dispatcher's entry method shadowed by an instance attribute that, at the role's
  first dispatch (its layers all adopted and elected then), describes the role's reports, starts its series and
  shadows the methods with the counting ones, which check nothing more per call; ``unadopt`` undoes it.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable

import torch
from capwatch.dispatcher.counting import CapOverflowError, LayerCounting
from capwatch.sglang_plugin.releases import CAPTURE_TARGETS, Target
from capwatch.sizing.backends import BackendCapRules

logger = logging.getLogger("capwatch.sglang")

CREATE_DISPATCHER = Target("sglang.srt.layers.moe.fused_moe_triton.layer.create_moe_dispatcher",
                           ("moe_runner_config",))
GET_FLAGS = Target("sglang.srt.runtime_context.get_flags")  # .moe.speculative_context: a draft model's layers
COMMON_TARGETS = (CREATE_DISPATCHER, GET_FLAGS, *CAPTURE_TARGETS)  # what register relies on, in every release


def register(session, source, init: Target, adopt_one: Callable, what: str) -> None:
    """Hook the construction of ``init``'s class (``adopt_one(session, dispatcher, role, layer_id)`` after SGLang's
    own ``__init__``), ``create_moe_dispatcher`` (the layer id it is building) and the graph captures (snapshots
    paused). ``what`` names the dispatcher in the line an adoption failure logs."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    get_flags = pkgutil.resolve_name(GET_FLAGS.name)
    creating: list[int | None] = []  # the layer id create_moe_dispatcher is building, innermost last

    def around_create(original, moe_runner_config, *args, **kwargs):
        creating.append(getattr(moe_runner_config, "layer_id", None))
        try:
            return original(moe_runner_config, *args, **kwargs)
        finally:
            creating.pop()

    def around_init(original, dispatcher, *args, **kwargs):
        original(dispatcher, *args, **kwargs)
        try:
            role = "draft" if get_flags().moe.speculative_context else "target"
            adopt_one(session, dispatcher, role, creating[-1] if creating else None)
        except Exception:
            logger.exception("capwatch: this %s dispatcher is not instrumented (adoption failed); it runs as "
                             "SGLang's", what)

    def around_capture(original, *args, **kwargs):
        with session.capturing():
            return original(*args, **kwargs)

    HookRegistry.register(init.name, around_init, HookType.AROUND, source=source)
    HookRegistry.register(CREATE_DISPATCHER.name, around_create, HookType.AROUND, source=source)
    for target in CAPTURE_TARGETS:
        HookRegistry.register(target.name, around_capture, HookType.AROUND, source=source)


def count_layer(session, dispatcher, role: str, layer_id: int | None, geometry: dict, rules: BackendCapRules,
                traffic: Callable, lead_per_micro_batch: bool, split_traffic_halves: bool = False) -> LayerCounting:
    """``dispatcher`` as one layer of its role's counters (made with the role's first layer, on this process's GPU or
    the CPU), its way into them ``traffic(counters)``; the role's traffic sample is its leader's layer alone (what it
    receives counted by the next place with ``split_traffic_halves``: a hook counting each half in its own call)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    layer = session.count_layer(dispatcher, dispatcher, role, layer_id, geometry, device, rules, traffic=traffic,
                                traffic_stride=None, lead_per_micro_batch=lead_per_micro_batch,
                                split_traffic_halves=split_traffic_halves)
    return layer


def shipped(dispatcher, method: str) -> Callable:
    """``dispatcher.<method>`` as SGLang's class defines it (not the instance's shadow)."""
    return getattr(type(dispatcher), method).__get__(dispatcher)


def count_from_first_dispatch(session, dispatcher, layer: LayerCounting, method: str, describe: Callable[[], dict],
                              counting: Callable[[], dict[str, Callable]]) -> None:
    """Shadow ``dispatcher.<method>`` until the role's first dispatch: then the role's reports (``describe()``: what
    they carry beyond the geometry, its buffer counted; once per role) and series start, and ``counting()`` (method
    name -> its counted call, built now that the role's leaders and traffic sample are elected) shadows SGLang's
    methods for every later call, this one included."""
    role = layer.counters.role

    def first(*args, **kwargs):
        watch = session.roles[role]
        if not watch.reported:
            watch.reported = describe()
        session.start_role_once(role)
        counted = counting()
        for name, call in counted.items():
            setattr(dispatcher, name, call)
        return counted[method](*args, **kwargs)

    setattr(dispatcher, method, first)


def unadopt(dispatcher, *methods: str) -> None:
    """SGLang's dispatcher exactly as shipped again: its ``methods``' shadows gone."""
    for method in methods:
        vars(dispatcher).pop(method, None)


def count_overflow(layer: LayerCounting, local_tokens: int) -> None:
    """A batch the backend will refuse: counted, reported (bounded wait) and logged, never raised; the backend's own
    check then ends the rank as it would without capwatch (``rules.overflow_outcome``)."""
    try:
        layer.guard(local_tokens, local_tokens)
    except CapOverflowError as overflow:
        logger.error("capwatch: %s (counted and reported; %s)", overflow, layer.rules.overflow_outcome)
