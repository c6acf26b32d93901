"""The queries over a data source (the SQLite store, or a Prometheus server; their contract:
``sources/contract.py``): a group's view (``cluster_view.py``), its advice and what-if (the advisor), from the
source's rank states and history. Routes and the group digests come through here."""

from __future__ import annotations

from capwatch.advisor.advice import Advice, WhatIf
from capwatch.advisor.evidence import GroupConfig
from capwatch.advisor.group import group_config
from capwatch.advisor.kv import kv_bytes_per_token_of
from capwatch.backends import pricing_of, spec_of
from capwatch.engines import limits_of
from capwatch.advisor.recommend import recommend, whatif
from capwatch.service.cluster_view import ClusterView, rank_status, summarize_cluster
from capwatch.service.config import Settings
from capwatch.service.sources.contract import ClusterSource, RankState


class UnknownCluster(LookupError):
    pass


class AdviceUnavailable(RuntimeError):
    """A cluster whose advice cannot be computed from what its ranks report (say, ranks whose configs
    cannot be priced together). Only that cluster shows the error; every other one keeps working."""


# What pricing or the advisor raise on inputs they cannot use (SizingError is a ValueError).
_UNPRICEABLE = (ValueError, ArithmeticError)


# Each function takes the cluster's states if the caller already has them: against Prometheus one
# rank_states call is ten queries, so a request fetches them once and passes them down.


def role_states(source: ClusterSource, cluster: str, role: str,
                states: list[RankState] | None = None) -> list[RankState]:
    states = source.rank_states(cluster) if states is None else states
    if not states:
        raise UnknownCluster(f"no rank of cluster {cluster!r} has reported; known clusters: "
                             f"{', '.join(source.clusters()) or 'none yet'}")
    chosen = [state for state in states if state.role == role]
    if not chosen:
        raise UnknownCluster(f"cluster {cluster!r} has no {role!r} ranks; roles: "
                             f"{', '.join(sorted({state.role for state in states}))}")
    return chosen


def cluster_view(source: ClusterSource, cluster: str, role: str, now_s: float, settings: Settings,
                 states: list[RankState] | None = None) -> ClusterView:
    states = source.rank_states(cluster) if states is None else states
    role_states(source, cluster, role, states)
    return summarize_cluster(cluster, role, states, now_s, settings.stale_after_s, settings.missing_after_s)


def group_config_of_ranks(states: list[RankState], now_s: float, settings: Settings) -> GroupConfig:
    """The group's configuration from its ranks that are not missing (all of them if every one is)."""
    live = [state for state in states
            if rank_status(state, now_s, settings.stale_after_s, settings.missing_after_s) != "missing"] or states
    backends = sorted({state.config.a2a_backend for state in live})
    if len(backends) > 1:  # one backend's rules would advise the others' ranks: never silently
        raise ValueError(f"its ranks run different A2A backends ({', '.join(backends)}); see the group's "
                         "backend_mismatch finding")
    widest = max(live, key=lambda state: (state.cap, state.ep_rank))
    config = widest.config
    spec = spec_of(config.a2a_backend)
    return group_config(
        cap=widest.cap, pricing=pricing_of(config, max(state.ep_size for state in live)),
        a2a_backend=spec.rules, prefill_dispatched=spec.prefill_dispatched(spec.params_of(config)),
        engine_limits=[limits_of(state.config) for state in live],
        cuda_graph_max_batch_sizes=[state.config.cuda_graph_max_batch_size for state in live],
        speculative_tokens=[state.config.speculative_tokens for state in live],
        # A config rebuilt from Prometheus may lack the geometry (an UnpricedConfig's are None): then no KV price.
        kv_bytes_per_token=kv_bytes_per_token_of(config.hidden_size, config.top_k, config.num_experts))


def cluster_advice(source: ClusterSource, cluster: str, role: str, now_s: float, settings: Settings,
                   states: list[RankState] | None = None) -> Advice:
    states = role_states(source, cluster, role, states)
    history = source.sample_history(cluster, role)
    try:
        return recommend(history, group_config_of_ranks(states, now_s, settings), settings.advisor_for(cluster))
    except _UNPRICEABLE as error:
        raise AdviceUnavailable(f"no advice for cluster {cluster!r} ({role}): {error}") from error


def cluster_whatif(source: ClusterSource, cluster: str, role: str, caps: list[int], now_s: float,
                   settings: Settings, states: list[RankState] | None = None) -> list[WhatIf]:
    states = role_states(source, cluster, role, states)
    history = source.sample_history(cluster, role)
    try:
        group = group_config_of_ranks(states, now_s, settings)
    except _UNPRICEABLE as error:
        raise AdviceUnavailable(f"no what-if for cluster {cluster!r} ({role}): {error}") from error
    for cap in caps:  # the group's own backend's range (DeepEP's 1..1024): a cap outside it is a bad question (422)
        group.backend.check_cap(cap)
    try:
        return whatif(history, group, caps, settings.advisor_for(cluster))
    except _UNPRICEABLE as error:
        raise AdviceUnavailable(f"no what-if for cluster {cluster!r} ({role}): {error}") from error
