"""Which SGLang and FlashInfer the plugin knows, and where it attaches: checked before any hook.

A release the plugin was not written against, or a hook target that moved, disables the plugin
with one reason (logged once, exported as ``capwatch_sglang_plugin_info``); SGLang then runs as
without it.
"""

from __future__ import annotations

import importlib.metadata
import pkgutil

SUPPORTED_SGLANG = ("0.5.23",)
SUPPORTED_FLASHINFER = ("0.7.2", "0.7.2.post1")  # what sglang 0.5.23 pins, and its hot-fix

DISPATCHER_MODULE = "sglang.srt.layers.moe.token_dispatcher.flashinfer"
DISPATCHER_CLASS = f"{DISPATCHER_MODULE}.FlashinferDispatcher"
PUBLISH = "sglang.srt.runtime_context.publish"
DISPATCHER_INIT = f"{DISPATCHER_CLASS}.__init__"
DISPATCH = f"{DISPATCHER_CLASS}.dispatch"
# Every graph capture of a scheduler goes through one of these (spec runners subclass the two runners).
CAPTURE_TARGETS = (
    "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_cuda_graphs",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.capture",
)
# What the dispatch hook reads off the dispatcher's module to compute R exactly as SGLang does.
DISPATCHER_MODULE_NAMES = (
    "_max_tokens_per_scattered_source", "get_dp_global_num_tokens", "get_is_extend_in_batch", "get_forward",
    "get_parallel", "_WorkspaceNamespace",
)
NAMESPACES = ("DECODE", "SPECULATIVE", "SP_PREFILL")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {"sglang": _version("sglang"), "flashinfer": _version("flashinfer-python")}


def unsupported_reason(found: dict[str, str | None]) -> str | None:
    """Why these versions are not supported, or None."""
    if found["sglang"] not in SUPPORTED_SGLANG:
        return f"sglang {found['sglang']} is not supported (capwatch knows {', '.join(SUPPORTED_SGLANG)})"
    if found["flashinfer"] not in SUPPORTED_FLASHINFER:
        return (f"flashinfer-python {found['flashinfer']} is not supported beside sglang {found['sglang']} "
                f"(capwatch knows {', '.join(SUPPORTED_FLASHINFER)})")
    return None


def moved_target_reason() -> str | None:
    """Why a hook target cannot be used (moved, renamed, or without what the hooks read), or None."""
    for target in (DISPATCHER_INIT, DISPATCH, *CAPTURE_TARGETS):
        try:
            pkgutil.resolve_name(target)
        except Exception as error:  # ImportError, AttributeError, or whatever the import raised
            return f"hook target {target} is not there ({type(error).__name__}: {error})"
    module = pkgutil.resolve_name(DISPATCHER_MODULE)
    missing = [name for name in DISPATCHER_MODULE_NAMES if not hasattr(module, name)]
    missing += [f"_WorkspaceNamespace.{name}" for name in NAMESPACES
                if not hasattr(getattr(module, "_WorkspaceNamespace", None), name)]
    if missing:
        return f"{DISPATCHER_MODULE} lacks {', '.join(missing)}"
    if not getattr(module, "use_flashinfer", False):
        return f"{DISPATCHER_MODULE} could not import flashinfer's MoE A2A (use_flashinfer is False)"
    return None
