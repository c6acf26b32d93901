"""FlashInfer's MegaMoE layer in SGLang (``--moe-a2a-backend flashinfer_megamoe``): what the plugin hooks, on 0.5.22
and 0.5.23 (one adapter).

SGLang's dispatcher is the standard one here: the A2A lives in the fused kernel, one
``flashinfer.moe_ep.MoEEpMegaLayer`` per MoE layer, built lazily by
``layers/moe/flashinfer_megamoe.py`` ``_ensure_flashinfer_megamoe_layer(layer, ...)`` with
``FleetParams(max_tokens_per_rank=T)``, T from ``_resolve_max_tokens_per_rank()`` (the variable above 0, else
SGLang derives it: ``runtime_context.cutedsl_moe_max_num_tokens()``, else 1024). Each forward of that layer goes
through ``layer._flashinfer_megamoe_forward(mega, tensors)`` (read by the quantisation's ``apply`` at every call),
and FlashInfer raises ``MoEEpConfigError`` when the rank's tokens are above T.

After SGLang builds a layer (a ``HookRegistry`` hook around ``_ensure_flashinfer_megamoe_layer``) the plugin adopts
it: ``layer._flashinfer_megamoe_forward`` is shadowed on the instance by one that counts through the layer's
``LayerCounting`` (``dispatcher/counting.py``): each rank's own batch against T (no group-wide R), the step on the
leader, the (token, expert) pairs sent on the traffic sample (``hooks/local_batch.py``'s ``SentPairs`` into the
role's expert bins, its scratch shared by the role's layers), and a batch above T counted and reported (bounded
wait) before FlashInfer's error ends the rank (``hooks/adoption.py``). The workspace's bytes are read from the built
layer after its first forward (it is allocated there, on the symmetric heap, and pooled across layers): the storage
of every tensor its workspaces hold, each workspace counted once per process (``backends/reported.py``).

The cap a rank runs is the resolved T: the plugin says at start where it comes from (``cap_at_start``), and the
floor module reports a variable of 0 as SGLang's default (derived), not the operator's number.
"""

from __future__ import annotations

import logging
import os
import pkgutil

import torch
from capwatch.backends.reported import ReportedBuffer
from capwatch.dispatcher.counting import LayerCounting
from capwatch.sglang_engine.caps import bind, reported_backend
from capwatch.sglang_plugin.floors import flashinfer_megamoe as FLOOR  # its cap's floor, per release
from capwatch.sglang_plugin.hooks import adoption, local_batch
from capwatch.sglang_plugin.releases import CAPTURE_TARGETS, Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.flashinfer_megamoe import FLASHINFER_MEGAMOE as MEGAMOE_RULES

logger = logging.getLogger("capwatch.sglang")

MEGAMOE = bind(MEGAMOE_RULES)  # with SGLang's variable for its cap

NAME = MEGAMOE.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.flashinfer_megamoe"
ENSURE_LAYER = Target(f"{MODULE}._ensure_flashinfer_megamoe_layer", ("layer",))
RESOLVE_CAP = Target(f"{MODULE}._resolve_max_tokens_per_rank")
DERIVED_CAP = Target("sglang.srt.runtime_context.cutedsl_moe_max_num_tokens")
LIBRARY = "flashinfer.moe_ep"
MEGA_LAYER = Target(f"{LIBRARY}.MoEEpMegaLayer.forward", ("t",))
CREATE_WORKSPACE = Target(f"{LIBRARY}.MoEEpMegaLayer.create_workspace", ("max_tokens_per_rank",))
FALLBACK_CAP = 1024  # _resolve_max_tokens_per_rank's when nothing can be derived
MAX_WALK_DEPTH = 4  # how deep the workspace's objects are searched for tensors


# verified on 0.5.22 and 0.5.23 (tests/sglang/test_flashinfer_megamoe_plugin.py); 0.5.20 - 0.5.21's FlashInfer pin has
# no MoEEpMegaLayer.create_workspace, 0.5.19 no MegaMoE
ADAPTER = Adapter(releases=("0.5.22", "0.5.23"),
                  hooked=(ENSURE_LAYER, RESOLVE_CAP, DERIVED_CAP, MEGA_LAYER, CREATE_WORKSPACE, adoption.GET_FLAGS,
                          *CAPTURE_TARGETS))
ADAPTERS = ADAPTER.by_release()


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why the MegaMoE layers cannot be instrumented, or None: FlashInfer's moe_ep imports (SGLang imports it when
    it builds the first layer, which raises without it: the backend is unavailable), then every target and
    signature."""
    try:
        pkgutil.resolve_name(LIBRARY)
    except Exception as error:
        return library_missing("FlashInfer MegaMoE layer", LIBRARY, error,
                               "a flashinfer-python that has flashinfer.moe_ep")
    return first_problem(adapter.targets())


# --- the cap a rank runs ----------------------------------------------------------------------------

def cap_at_start() -> tuple[int, str]:
    """The T every MegaMoE layer of this scheduler will be built with (SGLang's own resolution, run now), and where
    it comes from, in words."""
    cap = int(pkgutil.resolve_name(RESOLVE_CAP.name)())
    raw = os.environ.get(MEGAMOE.cap_env_var)
    if raw is not None and raw.strip() not in ("", "0"):
        return cap, f"{MEGAMOE.cap_env_var}={raw.strip()}"
    derived = int(pkgutil.resolve_name(DERIVED_CAP.name)())
    if derived > 0:
        return cap, (f"derived by SGLang ({MEGAMOE.cap_env_var} is {'0' if raw is not None else 'unset'}): "
                     f"cutedsl_moe_max_num_tokens() = {derived}, the largest of the prefill tokens, the prefill "
                     "CUDA-graph batch and the decode CUDA-graph batch x tokens per request")
    return cap, f"SGLang's fallback {FALLBACK_CAP} ({MEGAMOE.cap_env_var} is 0 and nothing to derive it from)"


# --- the hooks --------------------------------------------------------------------------------------

def register(session, adapter: Adapter, source) -> None:
    """Say the cap's origin once; hook the layer build (adoption) and the graph captures."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        cap, origin = cap_at_start()
        logger.info("capwatch: FlashInfer MegaMoE layers are built with max_tokens_per_rank=%d: %s", cap, origin)
    except Exception as error:  # the runtime context SGLang derives it from is not there: said, nothing else
        logger.warning("capwatch: the MegaMoE cap cannot be resolved at start (%s: %s); the layers report it when "
                       "built", type(error).__name__, error)
    get_flags = pkgutil.resolve_name(adoption.GET_FLAGS.name)

    def around_ensure(original, layer, *args, **kwargs):
        built = getattr(layer, "_flashinfer_megamoe_layer", None)
        mega = original(layer, *args, **kwargs)
        if built is None and mega is not None:
            try:
                role = "draft" if get_flags().moe.speculative_context else "target"
                adopt(session, layer, mega, role)
            except Exception:
                logger.exception("capwatch: this MegaMoE layer is not instrumented (adoption failed); it runs as "
                                 "SGLang's")
        return mega

    def around_capture(original, *args, **kwargs):
        with session.capturing():
            return original(*args, **kwargs)

    HookRegistry.register(ENSURE_LAYER.name, around_ensure, HookType.AROUND, source=source)
    for target in CAPTURE_TARGETS:
        HookRegistry.register(target.name, around_capture, HookType.AROUND, source=source)


def adopt(session, layer, mega, role: str) -> LayerCounting:
    """Count one SGLang MoE layer's MegaMoE forwards (``layer._flashinfer_megamoe_forward``, shadowed on the
    instance); FlashInfer's layer and SGLang's classes are left alone."""
    cap = int(mega._fleet_params.max_tokens_per_rank)  # what FlashInfer checks each forward against
    counted = local_batch.Counted(cap=cap, ep_rank=int(layer.moe_ep_rank), ep_size=int(layer.moe_ep_size),
                                  hidden_size=int(layer.hidden_size), top_k=int(layer.top_k),
                                  num_experts=int(layer.num_experts))
    counting = local_batch.count_layer(session, layer, counted, MEGAMOE, role, getattr(layer, "layer_id", None),
                                       lead_per_micro_batch=False)
    sent = _sent_pairs(session, role, counting, cap, counted.top_k)
    layer._flashinfer_megamoe_forward = _first_forward(session, layer, mega, role, counting, sent,
                                                       layer._flashinfer_megamoe_forward)
    return counting


_SCRATCH: dict[tuple[int, str], local_batch.SentPairs] = {}  # (session, role) -> the scratch its layers share


def _sent_pairs(session, role: str, counting: LayerCounting, cap: int, top_k: int) -> local_batch.SentPairs:
    """The layer's way into the counters with the role's one scratch (the layers run one after another; a cap of
    thousands of tokens would cost megabytes of scratch per layer)."""
    shared = _SCRATCH.get((id(session), role))
    if shared is None:
        shared = _SCRATCH[(id(session), role)] = local_batch.SentPairs.made(counting, cap, top_k)
    return local_batch.SentPairs(counting.traffic, shared.ones, shared.ids)


def _first_forward(session, layer, mega, role: str, counting: LayerCounting, sent: local_batch.SentPairs,
                   forward):
    """The role's reports and series start at its first forward, once the workspace it allocates exists (an
    overflow there finds no workspace to report: counted and logged only); then the counting forward alone."""
    counted = counted_forward(forward, counting, sent)

    def first(mega_layer, tensors):
        layer._flashinfer_megamoe_forward = counted
        watch = session.roles[role]
        if watch.reported or tensors.hidden_states.shape[0] > counting.cap:
            if watch.reported:
                session.start_role_once(role)
            return counted(mega_layer, tensors)
        output = forward(mega_layer, tensors)  # allocates the workspace (collective, as without capwatch)
        try:
            watch.reported = describe_workspaces(session, mega, role)
        except Exception:  # the counters keep counting; no reports without the bytes they are priced in
            logger.exception("capwatch: the %s MegaMoE workspace's bytes cannot be read: no reports", role)
        if watch.reported:
            session.start_role_once(role)
        _count(counting, sent, tensors)
        return output

    return first


def counted_forward(forward, counting: LayerCounting, sent: local_batch.SentPairs):
    """``forward(mega, tensors)`` counted by the layer: the guard (R is the rank's own batch), the call, the step on
    the leader, the pairs sent on the traffic sample."""
    cap = counting.cap

    def counted(mega, tensors):
        local_tokens = tensors.hidden_states.shape[0]
        if local_tokens > cap:
            adoption.count_overflow(counting, local_tokens)
            return forward(mega, tensors)  # FlashInfer's MoEEpConfigError ends it, as without capwatch
        output = forward(mega, tensors)
        _count(counting, sent, tensors)
        return output

    return counted


def _count(counting: LayerCounting, sent: local_batch.SentPairs, tensors) -> None:
    local_tokens = tensors.hidden_states.shape[0]
    if counting.step_leader:
        counting.counters.record_step(local_tokens, local_tokens)  # no group R: each rank's own batch
    if counting.counts_traffic:
        sent.count(tensors.topk_ids)
    counting.count_dispatch()


# --- the workspace's bytes --------------------------------------------------------------------------

def layer_workspaces(mega) -> list:
    """The backend workspaces a built MegaMoE layer holds: its default one (``_ensure_workspace``) and every
    capacity profile (``create_workspace``: SGLang's autotuned forward makes a ladder of them)."""
    found = [getattr(mega, "_workspace", None)]
    found += [getattr(handle, "_backend_workspace", None) for handle in getattr(mega, "_workspaces", {}).values()]
    return [workspace for workspace in found if workspace is not None]


def tensor_bytes(root) -> int:
    """The bytes of the storages of every tensor ``root`` holds (its attributes, fields, lists and dicts, a few
    levels deep), each storage once: what a workspace occupies, views and all."""
    storages: dict[int, int] = {}
    seen: set[int] = set()

    def walk(value, depth: int) -> None:
        if id(value) in seen or depth > MAX_WALK_DEPTH:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages.setdefault(storage.data_ptr() or id(storage), storage.nbytes())
            return
        if isinstance(value, (list, tuple, set, frozenset)):
            items = value
        elif isinstance(value, dict):
            items = value.values()
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            items = vars(value).values()
        else:
            return
        for item in items:
            walk(item, depth + 1)

    walk(root, 0)
    return sum(storages.values())


def describe_workspaces(session, mega, role: str) -> dict:
    """The layer's workspaces (allocated by its first forward, pooled across layers), each counted once per process,
    and what the reports carry: their bytes at the layer's cap."""
    total = 0
    for workspace in layer_workspaces(mega):
        size = tensor_bytes(workspace)
        session.count_buffer(role, id(workspace), size)
        total += size
    if total <= 0:
        raise RuntimeError("the MegaMoE layer holds no workspace tensor capwatch can read: its bytes are unknown")
    return dict(backend=reported_backend(MEGAMOE), a2a_backend=NAME,
                **{NAME: ReportedBuffer(buffer_bytes=total, dispatch_format="bf16")})  # SGLang hands it bf16
