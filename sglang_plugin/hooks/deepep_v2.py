"""DeepEP v2 in SGLang (``--moe-a2a-backend deepep_v2``): what the plugin hooks, on 0.5.22 - 0.5.23.

SGLang builds one ``DeepEPv2Dispatcher`` per MoE layer (``create_moe_dispatcher``); every dispatch, prefill and
decode, goes through ``DeepEPv2Dispatcher.dispatch(hidden_states, topk_output)``, whose ``_DeepEPv2Impl`` raises
a ``ValueError`` naming ``SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` when the rank's own batch is above
the cap (``_validate_common``), before the buffer is asked for. After SGLang constructs a dispatcher (a
``HookRegistry`` hook on ``__init__``; the layer id from ``create_moe_dispatcher``) the plugin counts its
``dispatch`` (``hooks/local_batch.py``): the overflow is counted and reported before SGLang's check raises. The
process-wide ``ElasticBuffer`` (``DeepEPv2Buffer.get_buffer``, lazy: built at the first dispatch or
``prebuild``) reports its ``num_bytes``: the bytes capwatch prices (``backends/reported.py``).
"""

from __future__ import annotations

import pkgutil

from capwatch.backends.reported import ReportedBuffer
from capwatch.sglang_engine.caps import bind
from capwatch.sglang_plugin.hooks import local_batch
from capwatch.sglang_plugin.floors import deepep_v2 as FLOOR  # its cap's start-up floor, per release
from capwatch.sglang_plugin.releases import Adapter, Target, first_problem
from capwatch.sglang_plugin.status import BackendUnavailable, library_missing
from capwatch.sizing.deepep_v2 import DEEPEP_V2 as DEEPEP_V2_RULES

DEEPEP_V2 = bind(DEEPEP_V2_RULES)  # with SGLang's variable and default for its cap

NAME = DEEPEP_V2.name  # --moe-a2a-backend
MODULE = "sglang.srt.layers.moe.token_dispatcher.deepep_v2"
DISPATCHER = f"{MODULE}.DeepEPv2Dispatcher"
INIT = Target(f"{DISPATCHER}.__init__", ("group", "router_topk", "num_experts", "num_local_experts", "hidden_size",
                                          "params_dtype", "use_fp8_dispatch"))
DISPATCH = Target(f"{DISPATCHER}.dispatch", ("hidden_states", "topk_output"))
GET_BUFFER = Target(f"{MODULE}._DeepEPv2Impl._get_buffer")
VALIDATE = Target(f"{MODULE}._DeepEPv2Impl._validate_common", ("hidden_states", "topk_ids"))


# verified on both (tests/sglang/test_deepep_v2_plugin.py)
ADAPTER = Adapter(releases=("0.5.22", "0.5.23"), hooked=(INIT, DISPATCH, GET_BUFFER, VALIDATE,
                                                         *local_batch.COMMON_TARGETS))
ADAPTERS = ADAPTER.by_release()
# Why the hooks do not run on the older releases (the plugin's one line says it).
_OLDER_FLOOR = ("its start-up check of the cap is another rule (validate_deepep_v2_dispatch_token_budget inline, "
                "without _decode_graph_dispatch_tokens_per_rank) that capwatch's floor does not read")
UNSUPPORTED = {
    "0.5.19": f"{_OLDER_FLOOR}, and its DeepEPv2Dispatcher takes no use_fp8_dispatch",
    "0.5.20": f"{_OLDER_FLOOR}, and its DeepEPv2Dispatcher takes no use_fp8_dispatch",
    "0.5.21": _OLDER_FLOOR,
}


def problem(adapter: Adapter, backend_version: str | None, newer: bool) -> str | BackendUnavailable | None:
    """Why DeepEP v2 cannot be instrumented, or None: deep_ep's ElasticBuffer imported (SGLang defers its import
    error to the dispatcher's first use: the backend is unavailable), then every target and signature."""
    module = pkgutil.resolve_name(MODULE)
    if not getattr(module, "use_deepep_v2", False):
        return library_missing("DeepEP v2 dispatcher", "deep_ep", getattr(module, "_deepep_v2_import_error", None),
                               "DeepEP v2 (deep_ep with ElasticBuffer, github.com/deepseek-ai/DeepEP)")
    return first_problem(adapter.targets())


def register(session, adapter: Adapter, source) -> None:
    """Hook construction (adoption), ``create_moe_dispatcher`` (the layer id) and the graph captures."""
    local_batch.register(session, source, INIT, adopt, "DeepEP v2")


def adopt(session, dispatcher, role: str, layer_id: int | None) -> None:
    """Count one dispatcher's ``dispatch`` (the buffer is SGLang's: nothing allocated but the counters)."""
    local_batch.adopt(session, dispatcher, "dispatch", local_batch.Counted.of(dispatcher._impl), DEEPEP_V2, role,
                      layer_id,
                      describe=lambda: describe_buffer(session, dispatcher, role))


def describe_buffer(session, dispatcher, role: str) -> dict:
    """The process-wide ``ElasticBuffer`` (built now if no dispatch or prebuild has yet), counted once per process:
    its ``num_bytes`` at the cap, and the dispatch format."""
    buffer = dispatcher._impl._get_buffer()
    buffer_bytes = int(buffer.num_bytes)
    return local_batch.reported(session, role, DEEPEP_V2, buffer, buffer_bytes,
                                ReportedBuffer(buffer_bytes=buffer_bytes,
                                               dispatch_format="fp8" if dispatcher.use_fp8_dispatch else "bf16"))
