"""The one list of metrics capwatch exports per rank.

The exporter, the Grafana dashboards, the Prometheus rules and the docs all read this list,
so a renamed metric breaks their tests instead of silently emptying a panel.
Prometheus conventions: one prefix, base units, ``_total`` on counters, ``_ratio`` in 0-1,
and only a few series per rank (no per-expert or per-layer labels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from capwatch.backends import SPECS
from capwatch.backends.spec import BackendSpec
from capwatch.engines import ENGINE, ENGINES
from capwatch.series import OwnSeries

PREFIX = "moe_a2a_"
# Every per-rank series carries these; ``ep_group`` names the EP group (a deployment: CAPWATCH_CLUSTER, the
# service's cluster). It was ``cluster`` before, the label multi-cluster Prometheus, Thanos, Mimir and
# kube-prometheus set for the Kubernetes cluster: the old name is served beside it for one release on request
# (telemetry/exposition.py).
GROUP_LABEL = "ep_group"
LEGACY_GROUP_LABEL = "cluster"
RANK_LABELS: tuple[str, ...] = (GROUP_LABEL, "ep_rank", "dispatcher")

MetricType = Literal["gauge", "counter", "histogram", "info"]


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exposed (counters include _total; info includes _info)
    type: MetricType
    help: str
    unit: str  # "bytes", "tokens", "ratio", "steps", "calls", "events", "" (info)
    labels: tuple[str, ...] = RANK_LABELS


# moe_a2a_info's, each engine's moe_a2a_<engine>_info's and each backend's moe_a2a_<backend>_info's own labels are
# RankConfig's, the engine's limits' (RankConfig.<engine>) and the backend's parameters' field names (ep_size aside,
# the identity's; cap_variable aside, the backend's variable from its rules, so an alert can name it); the value
# "none" on moe_a2a_info, an empty one on an engine's info, is None. A backend whose parameters ride the shared
# series (``on_shared_series``: the wire's first) has its labels on moe_a2a_info, after a2a_backend
# (SHARED_INFO_LABELS).
SHARED_INFO_LABELS: dict[str, tuple[str, ...]] = {
    spec.name: spec.series.info_labels for spec in SPECS.values()
    if spec.series is not None and spec.series.on_shared_series}
INFO_CONFIG_LABELS: tuple[str, ...] = ("backend", "a2a_backend",
                                       *(label for labels in SHARED_INFO_LABELS.values() for label in labels),
                                       "overflow_policy")

CAP_TOKENS = MetricSpec(
    "moe_a2a_cap_tokens", "gauge",
    "Per-rank token cap the A2A memory is sized for (the variable that sets it: moe_a2a_info's cap_variable).",
    "tokens")
WORKSPACE_BYTES = MetricSpec(
    "moe_a2a_workspace_bytes", "gauge",
    "A2A memory of this rank at its cap by its backend's sizing: its workspace or buffer as the engine "
    "allocates it.", "bytes")
WORKSPACE_ALLOCATED_BYTES = MetricSpec(
    "moe_a2a_workspace_allocated_bytes", "gauge",
    "A2A workspace or buffer bytes this rank's backend actually allocated (only where the backend knows).", "bytes")
DISPATCH_TOKEN_BYTES = MetricSpec(
    "moe_a2a_dispatch_token_bytes", "gauge",
    "Dispatch payload bytes per token (hidden states, scales, top-k ids and weights).", "bytes")
COMBINE_TOKEN_BYTES = MetricSpec(
    "moe_a2a_combine_token_bytes", "gauge",
    "Combine payload bytes per token.", "bytes")
INFO = MetricSpec(
    "moe_a2a_info", "info",
    "Configuration of this rank's A2A dispatcher, its backend and the variable of its cap (value is always 1).", "",
    RANK_LABELS + ("ep_size", *INFO_CONFIG_LABELS, "cap_variable"))
DISPATCH_CALLS = MetricSpec(
    "moe_a2a_dispatch_calls_total", "counter",
    "A2A dispatch calls (one per MoE layer per forward step, more when chunked; a step replayed in a CUDA graph "
    "counts one per layer of its role).", "calls")
FORWARD_STEPS = MetricSpec(
    "moe_a2a_forward_steps_total", "counter",
    "Forward steps that dispatched through the A2A (counted once across layers).", "steps")


def by_backend(says: Callable[[BackendSpec], str | None], otherwise: str) -> str:
    """What each registered backend ``says`` (``otherwise`` where it says nothing), the backends grouped by it:
    ``"a (deepep, mori); b (flashinfer)"``."""
    groups: dict[str, list[str]] = {}
    for name, spec in SPECS.items():
        groups.setdefault(says(spec) or otherwise, []).append(name)
    return "; ".join(f"{text} ({', '.join(names)})" for text, names in groups.items())


TOKENS_SENT = MetricSpec(
    "moe_a2a_tokens_sent_total", "counter",
    "Token copies this rank sent to expert ranks, by --moe-a2a-backend: "
    + by_backend(lambda spec: spec.traffic_copies, "one per distinct target rank per token")
    + f". Counted on a sample of the MoE layers only, not scaled; in {ENGINE.TITLE}: "
    + by_backend(lambda spec: spec.traffic_sample, "every layer")
    + ". Compare ranks and rates, not volumes.",
    "tokens")
TOKENS_RECEIVED = MetricSpec(
    "moe_a2a_tokens_received_total", "counter",
    "Token copies this rank received from source ranks (copies as moe_a2a_tokens_sent_total counts them), counted "
    f"on a sample of the MoE layers only, not scaled; in {ENGINE.TITLE}: "
    + by_backend(lambda spec: spec.traffic_received_sample, "the layers of moe_a2a_tokens_sent_total")
    + ".", "tokens")
OVERFLOW_EVENTS = MetricSpec(
    "moe_a2a_overflow_events_total", "counter",
    "Dispatches past the cap, by kind (runtime_over_cap: R > cap; local_over_runtime: local tokens > R) "
    "and outcome (raised or chunked).", "events",
    RANK_LABELS + ("kind", "outcome"))
CHUNKED_ROUNDS = MetricSpec(
    "moe_a2a_chunked_rounds_total", "counter",
    "Cap-sized dispatch rounds run by the chunk overflow policy.", "rounds")
RUNTIME_TOKENS = MetricSpec(
    "moe_a2a_runtime_tokens", "histogram",
    "Per-step runtime max tokens per rank R (the quantity the cap bounds); fixed buckets, the same whatever the "
    "cap; the sum is the exact sum of R, steps above the cap included.", "tokens")
RUNTIME_TOKENS_MAX = MetricSpec(
    "moe_a2a_runtime_tokens_max", "gauge",
    "Largest R seen since the rank started.", "tokens")
INTERVAL_PEAK_RUNTIME_TOKENS = MetricSpec(
    "moe_a2a_interval_peak_runtime_tokens", "gauge",
    "Largest R in the last completed reporting interval (a scrape sees only some intervals; for alerts use "
    "moe_a2a_runtime_tokens_window_max).", "tokens")
INTERVAL_PEAK_UTILIZATION = MetricSpec(
    "moe_a2a_interval_peak_utilization_ratio", "gauge",
    "Largest R in the last completed reporting interval divided by the cap (above 1 means overflow).", "ratio")
# The peak that does not depend on scrape cadence: computed at scrape time from the R histogram's
# growth since the previous scrape, kept over a trailing window (telemetry/peak_window.py).
RUNTIME_TOKENS_WINDOW_MAX = MetricSpec(
    "moe_a2a_runtime_tokens_window_max", "gauge",
    "Largest R over the trailing peak window (moe_a2a_peak_window_seconds); no step between two scrapes "
    "is missed, whatever the scrape interval, as long as it is at most the window.", "tokens")
RUNTIME_TOKENS_WINDOW_UTILIZATION = MetricSpec(
    "moe_a2a_runtime_tokens_window_utilization_ratio", "gauge",
    "moe_a2a_runtime_tokens_window_max divided by the cap (above 1 means overflow).", "ratio")
# Per rank means per rank: R is the group's value (every rank reports the same), so the rank that
# drives the group's peak shows only in each rank's own local batch.
INTERVAL_MAX_LOCAL_TOKENS = MetricSpec(
    "moe_a2a_interval_max_local_tokens", "gauge",
    "This rank's own largest local batch (tokens it dispatched in one step, not the group's R) in the last "
    "completed reporting interval.", "tokens")
LOCAL_TOKENS_WINDOW_MAX = MetricSpec(
    "moe_a2a_local_tokens_window_max", "gauge",
    "This rank's own largest local batch over the trailing peak window (moe_a2a_peak_window_seconds): each "
    "rank's own line; the rank whose line reaches moe_a2a_runtime_tokens_window_max drives the group's peak.",
    "tokens")
PEAK_WINDOW_SECONDS = MetricSpec(
    "moe_a2a_peak_window_seconds", "gauge",
    "Length of the trailing window of moe_a2a_runtime_tokens_window_max.", "seconds")

LOCAL_TOKENS_MAX = MetricSpec(
    "moe_a2a_local_tokens_max", "gauge",
    "This rank's own largest local batch since the rank started (absent until it records one).", "tokens")

# What the advisor needs of the configuration, so advice from Prometheus equals advice from reports:
# the model geometry (prices the workspace and KV-cache tokens) and the floor inputs. Numbers are
# plain gauges; an engine's categorical values are labels of its info series (ENGINE_METRICS).
MODEL_HIDDEN_SIZE = MetricSpec(
    "moe_a2a_model_hidden_size", "gauge",
    "Hidden size of the model (elements of one token's hidden state): the geometry that prices the workspace.", "")
MODEL_TOP_K = MetricSpec(
    "moe_a2a_model_top_k", "gauge",
    "Experts each token is routed to (top-k).", "experts")
MODEL_EXPERTS = MetricSpec(
    "moe_a2a_model_experts", "gauge",
    "Routed experts of the model (all ranks together).", "experts")
CUDA_GRAPH_MAX_BATCH_SIZE = MetricSpec(
    "moe_a2a_cuda_graph_max_batch_size", "gauge",
    "Largest CUDA-graph decode batch (requests), the advisor's floor input; absent when not reported.", "requests")
SPECULATIVE_TOKENS = MetricSpec(
    "moe_a2a_speculative_tokens", "gauge",
    "Speculative draft tokens each request adds per decode step (0: no speculative decoding).", "tokens")


@dataclass(frozen=True)
class OwnMetrics:
    """A backend's or an engine's own series (``BackendSpec.series``, an engine's ``SERIES``) as metrics: its info
    and its gauges with the field each reads (of the backend's parameters, of the engine's limits); both absent on
    ranks without them. ``info`` None (a backend): its labels are moe_a2a_info's (``on_shared_series``), and its
    gauges are exported on every rank, at its parameters' defaults on other backends' ranks."""

    info: MetricSpec | None
    info_labels: tuple[str, ...]
    gauges: tuple[tuple[MetricSpec, str], ...]
    counters: tuple[tuple[MetricSpec, str], ...] = ()  # (counter, the count's field), from the rank's own counts

    @property
    def on_shared_series(self) -> bool:
        return self.info is None

    @property
    def metrics(self) -> tuple[MetricSpec, ...]:
        return (*((self.info,) if self.info is not None else ()), *(spec for spec, _ in self.gauges),
                *(spec for spec, _ in self.counters))


def own_metrics(name: str, series: OwnSeries) -> OwnMetrics:
    """``series`` of the backend or engine ``name`` as metrics: ``moe_a2a_<name>_info`` and ``moe_a2a_<name>_<field>``
    (or the gauge's own ``metric``)."""
    return OwnMetrics(
        None if series.on_shared_series else
        MetricSpec(f"{PREFIX}{name}_info", "info", series.info_help, "", RANK_LABELS + series.info_labels),
        series.info_labels,
        tuple((MetricSpec(gauge.metric or f"{PREFIX}{name}_{gauge.field}", "gauge", gauge.help, gauge.unit),
               gauge.field) for gauge in series.gauges),
        tuple((MetricSpec(f"{PREFIX}{name}_{counter.field}_total", "counter", counter.help, counter.unit),
               counter.field) for counter in series.counters))


# Each engine's series (its ``SERIES``), read from its limits: present only on ranks under that engine.
ENGINE_METRICS: dict[str, OwnMetrics] = {engine.NAME: own_metrics(engine.NAME, engine.SERIES)
                                         for engine in ENGINES.values()}
BACKEND_METRICS: dict[str, OwnMetrics] = {spec.name: own_metrics(spec.name, spec.series)
                                          for spec in SPECS.values() if spec.series is not None}

# The reporter's own health, so an alert can say "this rank cannot reach the service".
REPORTS_PENDING = MetricSpec(
    "moe_a2a_reports_pending", "gauge",
    "Interval reports buffered on this rank, waiting for the service to accept them.", "reports")
REPORTS_DELIVERED = MetricSpec(
    "moe_a2a_reports_delivered_total", "counter",
    "Interval reports the service accepted (a retried duplicate counts once).", "reports")
REPORT_SEND_FAILURES = MetricSpec(
    "moe_a2a_report_send_failures_total", "counter",
    "Attempts to post a report that failed and will be retried (service down, timeout, broken response, 5xx, "
    "408/425/429).", "failures")
REPORTS_REJECTED = MetricSpec(
    "moe_a2a_reports_rejected_total", "counter",
    "Reports the service refused for good (4xx other than 401/403/408/425/429: an invalid report, e.g. a "
    "schema the service does not accept); they are dropped.", "reports")
REPORTS_MERGED = MetricSpec(
    "moe_a2a_reports_merged_total", "counter",
    "Buffered reports merged into the next while the buffer was full (the service unreachable): their counts "
    "arrive, their peaks at the coarser resolution of the merged interval.", "reports")
REPORTER_ERRORS = MetricSpec(
    "moe_a2a_reporter_errors_total", "counter",
    "Errors of this rank's own counting or reporting code that were caught (an interval that could not be cut): "
    "the rank and its counting go on, the steps go with the next interval. Above 0: a capwatch bug, report it.",
    "errors")
REPORT_AUTH_FAILURES = MetricSpec(
    "moe_a2a_report_auth_failures_total", "counter",
    "Attempts to post a report that the service refused with 401/403 (wrong or missing bearer token); "
    "retried until the token is fixed.", "failures")

METRICS: tuple[MetricSpec, ...] = (
    CAP_TOKENS, WORKSPACE_BYTES, WORKSPACE_ALLOCATED_BYTES, DISPATCH_TOKEN_BYTES, COMBINE_TOKEN_BYTES, INFO,
    DISPATCH_CALLS, FORWARD_STEPS, TOKENS_SENT, TOKENS_RECEIVED, OVERFLOW_EVENTS, CHUNKED_ROUNDS,
    RUNTIME_TOKENS, RUNTIME_TOKENS_MAX, INTERVAL_PEAK_RUNTIME_TOKENS, INTERVAL_PEAK_UTILIZATION,
    RUNTIME_TOKENS_WINDOW_MAX, RUNTIME_TOKENS_WINDOW_UTILIZATION, INTERVAL_MAX_LOCAL_TOKENS,
    LOCAL_TOKENS_WINDOW_MAX, PEAK_WINDOW_SECONDS, LOCAL_TOKENS_MAX,
    MODEL_HIDDEN_SIZE, MODEL_TOP_K, MODEL_EXPERTS,
    *(spec for backend in BACKEND_METRICS.values() if backend.on_shared_series for spec, _ in backend.gauges),
    CUDA_GRAPH_MAX_BATCH_SIZE, SPECULATIVE_TOKENS,
    *(metric for engine in ENGINE_METRICS.values() for metric in engine.metrics),
    *(metric for backend in BACKEND_METRICS.values() if not backend.on_shared_series for metric in backend.metrics),
    REPORTS_PENDING, REPORTS_DELIVERED, REPORT_SEND_FAILURES, REPORTS_REJECTED, REPORTS_MERGED, REPORT_AUTH_FAILURES,
    REPORTER_ERRORS,
)

# The report's RankConfig as series, so a Prometheus source rebuilds the config the reports carry:
# (gauge, RankConfig field), an engine's (ENGINE_METRICS: gauge, field of RankConfig.<engine>) and a backend's
# (BACKEND_METRICS). A gauge is absent where the field is None.
RANK_CONFIG_GAUGES: tuple[tuple[MetricSpec, str], ...] = (
    (CAP_TOKENS, "cap"), (WORKSPACE_BYTES, "workspace_bytes_per_rank"),
    (WORKSPACE_ALLOCATED_BYTES, "allocated_workspace_bytes"), (DISPATCH_TOKEN_BYTES, "dispatch_bytes_per_token"),
    (COMBINE_TOKEN_BYTES, "combine_bytes_per_token"), (MODEL_HIDDEN_SIZE, "hidden_size"), (MODEL_TOP_K, "top_k"),
    (MODEL_EXPERTS, "num_experts"),
    (CUDA_GRAPH_MAX_BATCH_SIZE, "cuda_graph_max_batch_size"), (SPECULATIVE_TOKENS, "speculative_tokens"),
)
# The R histogram's bucket bounds (tokens), the same on every rank whatever its cap, so ranks, restarts and caps
# aggregate (``sum by (le)``) while the cap is being tuned: powers of two and their halfway points 1.5 x 2^k, from
# 16 to MAX_CAP_TOKENS (2^20), every cap SGLang and capwatch accept. 33 bounds + ``+Inf``: each 1.33 - 1.5 x the
# one below. Fitted to each cap, as before, the bounds moved with every change of the cap.
RUNTIME_TOKEN_BUCKETS: tuple[float, ...] = tuple(sorted(
    {float(1 << power) for power in range(4, 21)} | {float(3 << power) for power in range(3, 19)}))


def markdown_table() -> str:
    """The catalogue as the Markdown table in docs/telemetry.md (a test keeps the two equal)."""
    rows = ["| metric | type | unit | labels | meaning |", "|---|---|---|---|---|"]
    for spec in METRICS:
        extra = [label for label in spec.labels if label not in RANK_LABELS]
        labels = ", ".join(("rank labels", *extra))
        rows.append(f"| `{spec.name}` | {spec.type} | {spec.unit or '-'} | {labels} | {spec.help} |")
    return "\n".join(rows) + "\n"
