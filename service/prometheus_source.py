"""The same views and advice, computed from a Prometheus server that already scrapes every rank
(``capwatch serve --prometheus-url``). Reads the per-rank series of ``telemetry/catalogue.py``
through Prometheus' HTTP API; stores nothing.

Mapping to the report-fed store:
- a rank = one ``moe_a2a_cap_tokens{cluster, ep_rank, dispatcher}`` series; its last sample's
  timestamp is "last seen" (a rank whose target is down goes stale in Prometheus and shows as missing);
- config = the gauges of ``catalogue.RANK_CONFIG_GAUGES`` (cap, workspace and per-token bytes, the model
  geometry, the CUDA-graph floor inputs) plus ``moe_a2a_info`` (ep_size, version), and SGLang's floor
  inputs from ``moe_a2a_sglang_info`` and ``catalogue.SGLANG_LIMIT_GAUGES``: the dict a report's
  ``RankConfig.model_dump()`` is, so the advisor gives the same advice from either source;
- the group sample per window = ``max`` over ranks of ``max_over_time`` of the trailing-window peak
  gauge ``moe_a2a_runtime_tokens_window_max`` (no scrape cadence misses a peak),
  over windows in which ``moe_a2a_forward_steps_total`` grew; overflow events per window from
  ``increase(moe_a2a_overflow_events_total{kind="runtime_over_cap"})``.
- each rank's own largest local batch per window = ``max_over_time`` of ``moe_a2a_local_tokens_window_max``.
Not exported per rank, so unknown here: boot ids, report sequence numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from capwatch.service.advisor.history import SampleHistory
from capwatch.service.advisor.sample import GroupSample
from capwatch.service.config import Settings
from capwatch.service.store.rank_state import RankState
from capwatch.service.store.sqlite import IntervalRow
from capwatch.telemetry import catalogue
from capwatch.telemetry.report import RankConfig

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series in one range query


GEOMETRY = ("hidden_size", "top_k", "num_experts")
# What rank_states reads besides the cap, in one instant query.
RANK_STATE_SERIES: tuple[str, ...] = (
    *(spec.name for spec, _ in catalogue.RANK_CONFIG_GAUGES if spec is not catalogue.CAP_TOKENS),
    *(spec.name for spec, _ in catalogue.SGLANG_LIMIT_GAUGES),
    catalogue.INFO.name, catalogue.SGLANG_INFO.name, catalogue.RUNTIME_TOKENS_WINDOW_MAX.name,
    catalogue.RUNTIME_TOKENS_MAX.name, catalogue.FORWARD_STEPS.name, catalogue.LOCAL_TOKENS_WINDOW_MAX.name,
    catalogue.LOCAL_TOKENS_MAX.name,
)


def rank_config_of(values: dict[str, float], info: dict[str, str], sglang_info: dict[str, str] | None) -> dict:
    """A rank's config as its reports carry it (``RankConfig.model_dump()``'s shape), from its series:
    ``values`` by metric name (the config gauges of ``catalogue.RANK_CONFIG_GAUGES`` and
    ``SGLANG_LIMIT_GAUGES``), the labels of ``moe_a2a_info`` and of ``moe_a2a_sglang_info`` (None: not
    under SGLang). A field whose gauge is absent (an exporter older than it) keeps the report's
    default; the geometry only when all three of its gauges are there."""
    def number(spec: catalogue.MetricSpec) -> int | None:
        value = values.get(spec.name)
        return None if value is None or not math.isfinite(value) else int(value)

    version = info.get("flashinfer_version")
    config: dict = {
        "payload_format": info.get("payload_format", "bf16"), "backend": info.get("backend", "unknown"),
        "flashinfer_version": None if version in (None, "", "none") else version,
        "overflow_policy": info.get("overflow_policy", "raise"), "eplb_stats_num_experts": 0,
        "dispatch_bytes_per_token": 1, "combine_bytes_per_token": 1, "workspace_bytes_per_rank": 0,
        "allocated_workspace_bytes": None, "cuda_graph_max_batch_size": None, "speculative_tokens": 0,
        "sglang": None,
    }
    for spec, field in catalogue.RANK_CONFIG_GAUGES:
        if number(spec) is not None:
            config[field] = number(spec)
    if sglang_info is not None:
        limits = {field: number(spec) for spec, field in catalogue.SGLANG_LIMIT_GAUGES if number(spec) is not None}
        config["sglang"] = {"sglang_version": sglang_info.get("sglang_version") or None,
                            "disaggregation_mode": sglang_info.get("disaggregation_mode", "null"),
                            "cap_source": sglang_info.get("cap_source", "env"),
                            "floor_rule": sglang_info.get("floor_rule") or "sglang", **limits}
    unpriced = {name: value for name, value in config.items() if name not in GEOMETRY}
    if not all(field in config for field in GEOMETRY):
        return unpriced  # an exporter older than the geometry gauges: priced by the cap's own layout
    try:
        return RankConfig.model_validate(config, strict=False).model_dump()
    except ValidationError:
        # Series no rank could have reported together (say, a hand-written exporter): what prices without them.
        return unpriced | {"sglang": None}


class SourceUnavailable(RuntimeError):
    """The data source (Prometheus) could not answer; the API turns this into 503."""


def _selector(cluster: str, role: str | None = None, **extra: str) -> str:
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    labels = {"cluster": cluster, **({"dispatcher": role} if role else {}), **extra}
    return "{" + ", ".join(f'{name}="{quoted(value)}"' for name, value in labels.items()) + "}"


class PrometheusSource:
    def __init__(self, url: str, settings: Settings, clock: Callable[[], float] = time.time,
                 history_s: float = 7 * 86_400.0):
        self.url = url.rstrip("/")
        self.settings = settings
        self.clock = clock
        self.history_s = history_s
        self._client = httpx.Client(base_url=self.url, timeout=settings.prometheus_timeout_s)
        # (cluster, role) -> (expires at, history): four range queries over up to a week, so reused
        # briefly; never longer than a window, the granularity at which the history can change.
        self._histories: dict[tuple[str, str], tuple[float, SampleHistory]] = {}
        self.history_cache_s = min(settings.prometheus_cache_s, settings.window_s)

    # --- HTTP API ---------------------------------------------------------------------------

    def _get(self, path: str, params: dict) -> dict:
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as error:
            raise SourceUnavailable(f"cannot reach Prometheus at {self.url}: {error}") from None
        try:
            body = response.json()
        except ValueError:
            raise SourceUnavailable(f"Prometheus at {self.url} answered {response.status_code} without JSON") from None
        if body.get("status") != "success":
            raise SourceUnavailable(f"Prometheus query failed: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expression: str) -> list[dict]:
        return self._get("/api/v1/query", {"query": expression, "time": self.clock()})["result"]

    def query_range(self, expression: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range",
                         {"query": expression, "start": start, "end": end, "step": step})["result"]

    def _by_rank(self, expression: str) -> dict[tuple[int, str], tuple[dict, float]]:
        """Instant vector keyed by (ep_rank, dispatcher): (labels, value)."""
        result = {}
        for series in self.query(expression):
            labels = series["metric"]
            result[(int(labels["ep_rank"]), labels.get("dispatcher", "target"))] = (labels, float(series["value"][1]))
        return result

    # --- ClusterSource ------------------------------------------------------------------------

    def clusters(self) -> list[str]:
        data = self._get("/api/v1/label/cluster/values",
                         {"match[]": catalogue.CAP_TOKENS.name, "start": self.clock() - self.settings.missing_after_s,
                          "end": self.clock()})
        return sorted(data)

    def rank_states(self, cluster: str) -> list[RankState]:
        selector = _selector(cluster)
        caps = self._by_rank(f"{catalogue.CAP_TOKENS.name}{selector}")
        if not caps:
            return []
        seen = self._by_rank(f"timestamp({catalogue.CAP_TOKENS.name}{selector})")
        # Every other per-rank series in one query: (ep_rank, dispatcher) -> name -> (labels, value).
        series: dict[tuple[int, str], dict[str, tuple[dict, float]]] = {}
        for item in self.query(f'{{__name__=~"{"|".join(RANK_STATE_SERIES)}", {selector[1:]}'):
            labels = item["metric"]
            key = (int(labels["ep_rank"]), labels.get("dispatcher", "target"))
            series.setdefault(key, {})[labels["__name__"]] = (labels, float(item["value"][1]))
        overflows: dict[tuple[int, str], dict[str, int]] = {}
        for item in self.query(f"{catalogue.OVERFLOW_EVENTS.name}{selector}"):
            labels = item["metric"]
            key = (int(labels["ep_rank"]), labels.get("dispatcher", "target"))
            count = int(float(item["value"][1]))
            if count:
                overflows.setdefault(key, {})[f"{labels['kind']}/{labels['outcome']}"] = count

        states = []
        for key, (labels, cap) in sorted(caps.items()):
            rank = series.get(key, {})
            values = {name: value for name, (_, value) in rank.items() if not math.isnan(value)}
            values[catalogue.CAP_TOKENS.name] = cap
            info = rank.get(catalogue.INFO.name, ({}, 1.0))[0]
            sglang_info = rank.get(catalogue.SGLANG_INFO.name, (None, 1.0))[0]
            last_seen = seen.get(key, (None, self.clock()))[1]

            def tokens(spec: catalogue.MetricSpec) -> int | None:
                value = values.get(spec.name)
                return None if value is None else int(value)

            states.append(RankState(
                cluster=cluster, role=key[1], ep_rank=key[0], ep_size=int(info.get("ep_size", 1)),
                boot_id="prometheus", sequence=0, host=labels.get("instance"), sent_unix_s=last_seen,
                received_unix_s=last_seen, config=rank_config_of(values, info, sglang_info),
                last_interval_end_unix_s=last_seen, last_interval_s=0.0, last_forward_steps=0,
                last_peak_runtime_tokens=tokens(catalogue.RUNTIME_TOKENS_WINDOW_MAX) or 0,
                max_runtime_tokens=tokens(catalogue.RUNTIME_TOKENS_MAX) or 0,
                overflow_totals=overflows.get(key, {}), forward_steps_total=tokens(catalogue.FORWARD_STEPS) or 0,
                reports=0, boots=1, last_max_local_tokens=tokens(catalogue.LOCAL_TOKENS_WINDOW_MAX),
                max_local_tokens=tokens(catalogue.LOCAL_TOKENS_MAX)))
        return states

    def _window_series(self, expression: str, start: float, end: float) -> dict[float, float]:
        result = self.query_range(expression, start, end, self.settings.window_s)
        if not result:
            return {}
        return {float(t): float(v) for t, v in result[0]["values"] if not math.isnan(float(v))}

    def sample_history(self, cluster: str, role: str) -> SampleHistory:
        now = self.clock()
        cached = self._histories.get((cluster, role))
        if cached is not None and now < cached[0]:
            return cached[1].copy()
        history = self._query_history(cluster, role)
        if self.history_cache_s > 0:
            self._histories = {key: entry for key, entry in self._histories.items() if now < entry[0]}
            self._histories[(cluster, role)] = (now + self.history_cache_s, history)
        return history.copy()

    def _query_history(self, cluster: str, role: str) -> SampleHistory:
        window = self.settings.window_s
        end = (self.clock() // window) * window + window
        start = max(end - self.history_s, end - MAX_POINTS * window)
        selector = _selector(cluster, role)
        seconds = f"{int(window)}s"
        peaks = self._window_series(
            f"max(max_over_time({catalogue.RUNTIME_TOKENS_WINDOW_MAX.name}{selector}[{seconds}]))", start, end)
        steps = self._window_series(f"sum(increase({catalogue.FORWARD_STEPS.name}{selector}[{seconds}]))", start, end)
        caps = self._window_series(f"max(max_over_time({catalogue.CAP_TOKENS.name}{selector}[{seconds}]))", start, end)
        overflow_selector = _selector(cluster, role, kind="runtime_over_cap")
        overflows = self._window_series(
            f"sum(increase({catalogue.OVERFLOW_EVENTS.name}{overflow_selector}[{seconds}]))", start, end)
        policy = self.settings.advisor
        history = SampleHistory(policy.half_life_s, window_s=window)
        samples = [GroupSample(at - window, int(peak), int(caps.get(at, 0)) or 1, round(overflows.get(at, 0.0)))
                   for at, peak in sorted(peaks.items()) if steps.get(at, 0.0) > 0]
        return history.add_all(samples, policy.bump_factor, policy.bump_min_tokens)

    def interval_rows(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                      limit: int) -> list[IntervalRow]:
        window = self.settings.window_s
        since = max(since_unix_s, until_unix_s - MAX_POINTS * window)
        selector = _selector(cluster, role)
        seconds = f"{int(window)}s"

        def per_rank(expression: str) -> dict[tuple[int, float], float]:
            values = {}
            for series in self.query_range(expression, since, until_unix_s, window):
                rank = int(series["metric"]["ep_rank"])
                for at, value in series["values"]:
                    if not math.isnan(float(value)):
                        values[(rank, float(at))] = float(value)
            return values

        peaks = per_rank(f"max_over_time({catalogue.RUNTIME_TOKENS_WINDOW_MAX.name}{selector}[{seconds}])")
        caps = per_rank(f"{catalogue.CAP_TOKENS.name}{selector}")
        steps = per_rank(f"increase({catalogue.FORWARD_STEPS.name}{selector}[{seconds}])")
        overflows = per_rank(f"sum by (ep_rank) (increase({catalogue.OVERFLOW_EVENTS.name}"
                             f"{_selector(cluster, role, kind='runtime_over_cap')}[{seconds}]))")
        local = per_rank(f"max_over_time({catalogue.LOCAL_TOKENS_WINDOW_MAX.name}{selector}[{seconds}])")

        def max_local_tokens(key: tuple[int, float]) -> int | None:
            # As a report says: 0 without steps; None where steps ran but no local batch was recorded.
            tokens, ran = local.get(key), round(steps.get(key, 0.0))
            return None if tokens is None or (tokens == 0 and ran) else int(tokens)

        rows = [IntervalRow(rank, at, int(peak), int(caps.get((rank, at), 0)) or 1, round(steps.get((rank, at), 0.0)),
                            round(overflows.get((rank, at), 0.0)), max_local_tokens((rank, at)))
                for (rank, at), peak in sorted(peaks.items(), key=lambda item: (item[0][1], item[0][0]))]
        return rows[-limit:]

    def close(self) -> None:
        self._client.close()
