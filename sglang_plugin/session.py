"""One scheduler process: the counters of each role, its exporter, its reports, whatever the backend.

Roles follow SGLang's workspaces: the decode one -> ``target``, the speculative one (a draft model's
layers) -> ``draft``, SP prefill (0.5.23) -> ``sp_prefill``. Each role has one ``DispatchCounters``
shared by all its layers; the lowest layer id is the step leader (with DeepEP's two-batch overlap, both
micro-batches' dispatchers of that layer lead: each micro-batch is its own dispatch against the cap).
A backend's hook module (``hooks/<backend>.py``) counts its dispatchers through :meth:`SchedulerSession.count_layer`
and says what its reports carry beyond the geometry (``RoleWatch.reported``). A role's telemetry (reporter, collector) starts at its first dispatch, when
every layer and workspace of the model is known; the exporter serves from the first moment (base port
+ local GPU index) with the plugin's own info metric.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

from capwatch.dispatcher.counters import DispatchCounters, pause_snapshots
from capwatch.dispatcher.flashinfer_backend import FlashInferMoeAlltoAllBackend
from capwatch.dispatcher.instrumented import InstrumentedDispatcher
from capwatch.sglang_plugin.settings import PluginSettings
from capwatch.sglang_plugin.status import PluginStatusCollector, RolesCollector
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.flashinfer_releases import FLASHINFER
from capwatch.telemetry.exporter import RankExporter
from capwatch.telemetry.rank import RankTelemetry, rank_config
from capwatch.telemetry.report import RankConfig, RankIdentity, SGLangLimits
from capwatch.telemetry.reporter import new_boot_id

logger = logging.getLogger("capwatch.sglang")


def reported_backend(rules: BackendCapRules) -> str:
    """The ``backend`` a plugin rank reports: the engine and SGLang's name of the A2A."""
    return f"sglang-{rules.name}"


@dataclass
class RoleWatch:
    """One role of one scheduler: shared counters, its layers, its distinct workspaces."""

    role: str
    counters: DispatchCounters
    geometry: dict
    layers: list[list] = field(default_factory=list)  # [layer id (inf: unknown), InstrumentedDispatcher, dispatcher]
    workspaces: dict[int, int] = field(default_factory=dict)  # data_ptr (or buffer id) -> bytes: each counted once
    # What the reports carry beyond the geometry (rank_config's backend, a2a_backend, flashinfer_version, deepep),
    # from the backend's hook module.
    reported: dict = field(default_factory=dict)
    lead_per_micro_batch: bool = False  # every dispatcher of the lowest layer id leads (DeepEP's two-batch overlap)
    telemetry: RankTelemetry | None = None
    started: bool = False  # a start was tried (at the role's first dispatch)

    def add_layer(self, layer_id: int | None, instrumented: InstrumentedDispatcher, dispatcher) -> None:
        self.layers.append([math.inf if layer_id is None else layer_id, instrumented, dispatcher])
        self.elect_leader()

    def elect_leader(self) -> None:
        lowest = min(entry[0] for entry in self.layers)
        leader = min(range(len(self.layers)), key=lambda index: self.layers[index][0])  # first of equals
        for index, (layer_id, each, _) in enumerate(self.layers):
            each.step_leader = index == leader or (self.lead_per_micro_batch and layer_id == lowest)


class SchedulerSession:
    def __init__(self, settings: PluginSettings, versions: dict[str, str | None], limits: SGLangLimits | None,
                 local_gpu_index: int, state: str = "enabled", reason: str = ""):
        self.settings = settings
        self.versions = versions
        self.limits = limits
        self.boot_id = new_boot_id()
        self.roles: dict[str, RoleWatch] = {}
        self._layers: dict[int, tuple[InstrumentedDispatcher, FlashInferMoeAlltoAllBackend]] = {}  # id(MoeAlltoAll)
        self.status = PluginStatusCollector(state, reason, versions)
        self.role_series = RolesCollector()
        options = settings.exporter(local_gpu_index)
        self.exporter = RankExporter(self.status, self.role_series, legacy_group_label=options.legacy_group_label)
        self.exporter.serve(options)

    # --- adoption, at FlashinferDispatcher construction ------------------------------------------

    def adopt_layer(self, dispatcher, alltoall, role: str, layer_id: int | None) -> InstrumentedDispatcher:
        """Count one MoeAlltoAll of a dispatcher (its own workspace: nothing allocated but the counters)."""
        backend = FlashInferMoeAlltoAllBackend.adopt(alltoall)
        geometry = dict(cap=dispatcher.max_num_tokens, ep_rank=backend.ep_rank, ep_size=backend.ep_size,
                        hidden_size=dispatcher.hidden_size, top_k=dispatcher.router_topk,
                        num_experts=dispatcher.num_experts)
        instrumented = self.count_layer(alltoall, dispatcher, backend, role, layer_id, geometry, backend.device,
                                        FLASHINFER)
        watch = self.roles[role]
        watch.reported = dict(backend=reported_backend(FLASHINFER), flashinfer_version=self.versions["flashinfer"])
        watch.workspaces.setdefault(alltoall.workspace.data_ptr(), int(alltoall.workspace_size_per_rank))
        self._layers[id(alltoall)] = (instrumented, backend)
        return instrumented

    def count_layer(self, counted, dispatcher, place, role: str, layer_id: int | None, geometry: dict, device,
                    rules: BackendCapRules, lead_per_micro_batch: bool = False) -> InstrumentedDispatcher:
        """One counted object of a dispatcher (``counted``: what ``layer_of`` finds it by), in its role's counters
        (made with the role's first layer: ``geometry``, the counters' ``device``). ``place`` has the rank's
        ``ep_rank`` and ``ep_size``; ``rules`` name the cap's variable in overflow messages."""
        watch = self.roles.get(role)
        if watch is None:
            counters = DispatchCounters(geometry["cap"], geometry["ep_size"], device, role=role)
            watch = self.roles[role] = RoleWatch(role, counters, geometry, lead_per_micro_batch=lead_per_micro_batch)
        instrumented = InstrumentedDispatcher(place, watch.counters, geometry["cap"], rules=rules)
        watch.add_layer(layer_id, instrumented, dispatcher)
        if watch.telemetry is not None:
            instrumented.on_overflow.append(watch.telemetry.on_overflow)
        self._layers[id(counted)] = (instrumented, None)
        return instrumented

    def count_buffer(self, role: str, buffer, size_bytes: int) -> None:
        """A buffer the role's layers share (DeepEP's one per process): its bytes in the role's reports, once."""
        self.roles[role].workspaces.setdefault(id(buffer), size_bytes)

    def layer_of(self, alltoall) -> InstrumentedDispatcher | None:
        found = self._layers.get(id(alltoall))
        return None if found is None else found[0]

    def traffic_counts(self, alltoall):
        return self._layers[id(alltoall)][1].traffic_counts()

    def set_layer_id(self, dispatcher, layer_id: int | None) -> None:
        """A layer id that reaches the plugin after construction (0.5.22: ``create_moe_dispatcher``)."""
        if layer_id is None:
            return
        for watch in self.roles.values():
            for entry in watch.layers:
                if entry[2] is dispatcher:
                    entry[0] = layer_id
            watch.elect_leader()

    # --- telemetry, from a role's first dispatch ------------------------------------------------------

    def start_role_once(self, role: str) -> None:
        watch = self.roles[role]
        if watch.started:
            return
        watch.started = True
        try:
            self.start_role(watch)
        except Exception:  # the counters keep counting; SGLang must not notice
            logger.exception("capwatch: the %s role's reports and series did not start", role)

    def start_role(self, watch: RoleWatch) -> RankTelemetry:
        geometry = watch.geometry
        identity = RankIdentity(cluster=self.settings.cluster, ep_rank=geometry["ep_rank"],
                                ep_size=geometry["ep_size"], role=watch.role, boot_id=self.boot_id,
                                host=socket.gethostname())
        telemetry = RankTelemetry(watch.counters, identity, self.config(watch), exporter=None,
                                  reporter=self.settings.reporter(),
                                  final_report_timeout_s=self.settings.final_report_timeout_s).start()
        for _, instrumented, _ in watch.layers:
            instrumented.on_overflow.append(telemetry.on_overflow)
        self.role_series.collectors.append(telemetry.collector)
        watch.telemetry = telemetry
        return telemetry

    def config(self, watch: RoleWatch) -> RankConfig:
        geometry = watch.geometry
        limits = self.limits
        return rank_config(
            cap=geometry["cap"], ep_size=geometry["ep_size"], hidden_size=geometry["hidden_size"],
            top_k=geometry["top_k"], num_experts=geometry["num_experts"], **watch.reported,
            allocated_workspace_bytes=sum(watch.workspaces.values()) or None,
            cuda_graph_max_batch_size=(limits.decode_cuda_graph_max_batch_size or None) if limits else None,
            speculative_tokens=(limits.tokens_per_request - 1) if limits else 0,
            sglang=limits,
        )

    # --- capture, shutdown ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Snapshots of every role pause while SGLang captures CUDA graphs."""
        with pause_snapshots(*(watch.counters for watch in self.roles.values())):
            yield

    def close(self, reason: str = "shutdown") -> None:
        for watch in self.roles.values():
            if watch.telemetry is not None:
                watch.telemetry.close(reason, self.settings.final_report_timeout_s)
        self.exporter.close()
