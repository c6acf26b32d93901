"""One rank's telemetry in one object: the exporter and the reporter over the same counters.

Wiring a rank (the demo copies this)::

    counters = DispatchCounters(cap, ep_size, device, role="target")
    dispatcher = InstrumentedDispatcher(backend, counters, cap, overflow_policy="raise")
    identity = RankIdentity(cluster="prod-a", ep_rank=rank, ep_size=ep_size, role="target", boot_id=new_boot_id())
    config = rank_config(cap=cap, ep_size=ep_size, hidden_size=7168, top_k=8, num_experts=256, backend="torch")
    telemetry = RankTelemetry(counters, identity, config,
                              exporter=ExporterOptions(base_port=9470, local_rank=local_rank),
                              reporter=ReporterOptions(service_url="http://127.0.0.1:8000")).start()
    dispatcher.on_overflow.append(telemetry.on_overflow)  # final report before a raise kills the rank
    ...
    telemetry.close()  # a final report ("shutdown"), then the threads stop
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from capwatch.dispatcher.counters import DispatchCounters
from capwatch.backends import DEFAULT_BACKEND, nest_params, spec_of
from capwatch.sizing.checks import SizingError
from capwatch.sizing.model_presets import custom_geometry
from capwatch.telemetry.collector import DispatchCollector
from capwatch.telemetry.exporter import ExporterOptions, RankExporter
from capwatch.telemetry.intervals import IntervalTracker
from capwatch.telemetry.peak_window import DEFAULT_PEAK_WINDOW_S
from capwatch.telemetry.report import RankConfig, RankIdentity
from capwatch.telemetry.reporter import RankReporter, ReporterOptions

# Without a reporter the exporter still closes intervals (for the interval-peak gauges) this often.
DEFAULT_INTERVAL_S = 5.0


class OverflowNotice(Protocol):
    """What the dispatcher's ``on_overflow`` callbacks receive (``dispatcher.OverflowEvent``)."""

    outcome: str

    @property
    def message(self) -> str: ...


def rank_config(
    *,
    cap: int,
    ep_size: int,
    hidden_size: int,
    top_k: int,
    num_experts: int,
    backend: str,
    overflow_policy: str = "raise",
    allocated_workspace_bytes: int | None = None,
    cuda_graph_max_batch_size: int | None = None,
    speculative_tokens: int = 0,
    a2a_backend: str = DEFAULT_BACKEND.name,
    **extra,
) -> RankConfig:
    """The reported configuration, priced by its backend's spec (``capwatch.backends``): FlashInfer's one pricing
    function (every layout), DeepEP's buffer as SGLang sizes it, ...; a backend's own parameters come as the
    keyword of its name (``deepep=DeepEPBuffer(...)``; the wire's first backend's also as keywords of their own,
    as before they moved under its name). Raises ``SizingError`` for a configuration the backend would refuse,
    and pydantic's ``ValidationError`` for one the service would refuse."""
    spec = spec_of(a2a_backend)
    try:
        extra = nest_params({**extra, "a2a_backend": a2a_backend})
    except ValueError as error:
        raise SizingError(str(error)) from None
    params = extra.get(spec.name)
    if isinstance(params, dict):
        params = spec.params.model_validate(params)  # ValidationError: what the service would refuse
    sizes = spec.sizes(cap, ep_size, custom_geometry(hidden_size, top_k, num_experts), params)
    return RankConfig(
        cap=cap, hidden_size=hidden_size, top_k=top_k, num_experts=num_experts, backend=backend,
        overflow_policy=overflow_policy, dispatch_bytes_per_token=sizes.dispatch_bytes_per_token,
        combine_bytes_per_token=sizes.combine_bytes_per_token, workspace_bytes_per_rank=sizes.workspace_bytes_per_rank,
        allocated_workspace_bytes=allocated_workspace_bytes,
        cuda_graph_max_batch_size=cuda_graph_max_batch_size, speculative_tokens=speculative_tokens,
        **{**extra, spec.name: params} if spec.params is not None else extra,
    )


class RankTelemetry:
    """Exporter (optional) and reporter (optional) for one rank and role. ``clock`` dates the reported
    intervals (default: the wall clock; see ``IntervalTracker``)."""

    def __init__(
        self,
        counters: DispatchCounters,
        identity: RankIdentity,
        config: RankConfig,
        *,
        exporter: ExporterOptions | None = ExporterOptions(),
        reporter: ReporterOptions | None = None,
        final_report_timeout_s: float = 2.0,
        peak_window_s: float = DEFAULT_PEAK_WINDOW_S,
        clock: Callable[[], float] | None = None,
        backend_counts: Callable[[], Mapping[str, int]] | None = None,
    ):
        self.identity = identity
        self.exporter_options = exporter
        self.final_report_timeout_s = final_report_timeout_s
        self.tracker = tracker = IntervalTracker(counters, clock)
        self.reporter = (RankReporter(counters, identity, config, reporter, tracker=tracker)
                         if reporter is not None else None)
        self.collector = DispatchCollector(
            tracker, identity, config,
            interval_s=None if self.reporter is not None else DEFAULT_INTERVAL_S,
            reporter_stats=self.reporter.stats if self.reporter is not None else None,
            peak_window_s=peak_window_s, backend_counts=backend_counts,
        )
        self.exporter = RankExporter(self.collector,
                                     legacy_group_label=exporter is not None and exporter.legacy_group_label)

    def start(self) -> "RankTelemetry":
        if self.exporter_options is not None:
            self.exporter.serve(self.exporter_options)
        if self.reporter is not None:
            self.reporter.start()
        return self

    @property
    def metrics_url(self) -> str | None:
        return self.exporter.url

    def on_overflow(self, event: OverflowNotice) -> None:
        """For ``InstrumentedDispatcher.on_overflow``: before a raise kills the rank, ship the final report."""
        if event.outcome == "raised" and self.reporter is not None:
            self.reporter.flush_final(event.message, timeout_s=self.final_report_timeout_s)

    def close(self, final_reason: str | None = "shutdown", timeout_s: float = 2.0) -> None:
        """Send a final report (so the service knows the rank left on purpose) within ``timeout_s``,
        then stop the reporter and the exporter."""
        if self.reporter is not None:
            self.reporter.close(final_reason, timeout_s)
        self.exporter.close()

    def __enter__(self) -> "RankTelemetry":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()
