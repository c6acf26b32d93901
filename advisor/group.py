"""The one builder of an EP group's ``GroupConfig`` from what is known of its ranks: the service's (each live
rank's reported config, ``service/queries.py``) and the log reader's (the server's args, one rank's worth,
``sglang_logs/advise.py``) go through ``group_config``, so both apply the same rules: the backend's cap rules by
its name, whether prefill batches go through the cap (its spec says, from its parameters), and each floor term's
largest value over the ranks (the cap is one number for all of them)."""

from __future__ import annotations

from collections.abc import Iterable

from capwatch.advisor.advice import CapSource
from capwatch.advisor.evidence import GroupConfig
from capwatch.backends import Pricing, spec_of
from capwatch.sizing.backends import BackendCapRules
from capwatch.engines import as_limits, merged_limits


def group_config(*, cap: int, pricing: Pricing, a2a_backend: str | BackendCapRules, prefill_dispatched: bool = True,
                 engine_limits: Iterable = (), cuda_graph_max_batch_sizes: Iterable[int | None] = (),
                 speculative_tokens: Iterable[int] = (), kv_bytes_per_token: int | None = None,
                 cap_source: CapSource = "reported", cap_at_least: int | None = None,
                 mem_fraction_static: float | None = None, cap_set_by_known: bool = True,
                 hidden_size: int | None = None, num_experts: int | None = None,
                 top_k: int | None = None) -> GroupConfig:
    """The group's configuration: ``cap`` its current cap (the largest the ranks run; where ``cap_source`` is
    "assumed", an assumption, not known), ``pricing`` its memory per rank at any cap, ``prefill_dispatched``
    whether its prefill batches go through the cap (``BackendSpec.prefill_dispatched``: DeepEP's only in
    --deepep-mode low_latency); the ranks' engine limits (capwatch.engines), CUDA-graph batches and draft
    tokens per step, each merged to its largest (None where not known); who set the cap, from the limits' cap
    source where ``cap_set_by_known`` (the ranks report it; a log does not show the environment); ``hidden_size``,
    ``num_experts`` and ``top_k`` the MoE geometry its cap is priced for (None where not known)."""
    graph_batches = [batch for batch in cuda_graph_max_batch_sizes if batch is not None]
    engine_limits = [as_limits(limits) for limits in engine_limits if limits]
    origins = {(limits.cap_source, limits.advice_revision) for limits in engine_limits}
    set_by, revision = origins.pop() if len(origins) == 1 else ("mixed" if origins else None, None)
    if not cap_set_by_known:  # a log does not show the environment: who set the cap is not known
        set_by, revision = None, None
    return GroupConfig(
        cap=cap, pricing=pricing,
        backend=a2a_backend if isinstance(a2a_backend, BackendCapRules) else spec_of(a2a_backend).rules,
        prefill_dispatched=prefill_dispatched,
        cuda_graph_max_batch_size=max(graph_batches) if graph_batches else None,
        speculative_tokens=max(speculative_tokens, default=0),
        engine_limits=merged_limits(engine_limits), kv_bytes_per_token=kv_bytes_per_token,
        cap_known=cap_source != "assumed", cap_source=cap_source, cap_at_least=cap_at_least,
        mem_fraction_static=mem_fraction_static, cap_set_by=set_by, cap_advice_revision=revision,
        hidden_size=hidden_size, num_experts=num_experts, top_k=top_k)
