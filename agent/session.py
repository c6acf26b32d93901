"""One rank process of an engine: the counters of each role, its exporter, its reports, whatever the backend.

Roles follow the engine's workspaces (SGLang's decode one -> ``target``, a draft model's -> ``draft``, SP
prefill -> ``sp_prefill``). Each role has one ``DispatchCounters`` shared by all its layers; the lowest layer id
is the step leader (with two-batch overlap, both micro-batches' dispatchers of that layer lead: each micro-batch
is its own dispatch against the cap). An engine plugin's hook module counts each counted object through
:meth:`RankSession.count_layer` and says what its reports carry beyond the geometry (``RoleWatch.reported``);
the plugin passes in what the engine defines (its limits' report fields, its status series). A role's telemetry
starts at its first dispatch, when every layer and workspace of the model is known; the exporter serves from
the first moment (base port + local GPU index) with the plugin's status series.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from capwatch.dispatcher.counters import DispatchCounters, pause_snapshots
from capwatch.dispatcher.counting import LayerCounting, TrafficWay, elect
from capwatch.agent.settings import AgentSettings
from capwatch.agent.status import RolesCollector
from capwatch.sizing.backends import BackendCapRules
from capwatch.telemetry.exporter import RankExporter
from capwatch.telemetry.rank import RankTelemetry, rank_config
from capwatch.telemetry.report import RankConfig, RankIdentity
from capwatch.telemetry.reporter import new_boot_id
from prometheus_client.registry import Collector

logger = logging.getLogger("capwatch.agent")


@dataclass
class RoleWatch:
    """One role of one scheduler: shared counters, its layers, its distinct workspaces."""

    role: str
    counters: DispatchCounters
    geometry: dict
    layers: list[list] = field(default_factory=list)  # [layer id (inf: unknown), LayerCounting, dispatcher]
    workspaces: dict[int, int] = field(default_factory=dict)  # data_ptr (or buffer id) -> bytes: each counted once
    # What the reports carry beyond the geometry (rank_config's backend, a2a_backend, flashinfer_version, deepep),
    # from the backend's hook module.
    reported: dict = field(default_factory=dict)
    lead_per_micro_batch: bool = False  # every dispatcher of the lowest layer id leads (DeepEP's two-batch overlap)
    traffic_stride: int | None = None  # the traffic sample (dispatcher.counting.elect): the backend's hook says
    split_traffic_halves: bool = False  # sent and received counted on two places (elect's split_halves: DeepEP)
    # The backend's own counts (its spec's BackendSeries.counters, by field), host ints its hook adds to.
    backend_counts: dict[str, int] = field(default_factory=dict)
    telemetry: RankTelemetry | None = None
    started: bool = False  # a start was tried (at the role's first dispatch)

    def add_layer(self, layer_id: int | None, counting: LayerCounting, dispatcher) -> None:
        self.layers.append([math.inf if layer_id is None else layer_id, counting, dispatcher])
        self.elect_leader()

    def elect_leader(self) -> None:
        """Each layer's place in model order (by layer id, first adopted first; a micro-batch's twin dispatcher of
        one layer id shares its place where the role leads per micro-batch), then who leads and who is sampled."""
        order = sorted(range(len(self.layers)), key=lambda index: self.layers[index][0])
        positions, place, previous = [0] * len(self.layers), -1, None
        for index in order:
            layer_id = self.layers[index][0]
            if not (self.lead_per_micro_batch and layer_id == previous and layer_id != math.inf):
                place += 1
            positions[index], previous = place, layer_id
        elect(self.counters, [entry[1] for entry in self.layers], positions, self.traffic_stride,
              split_halves=self.split_traffic_halves)


class RankSession:
    """``status``: the plugin's status series (the engine names it); ``versions``: the installed packages the
    hooks read (name -> version); ``limits``: what the engine's limits add to every report of this process
    (``rank_config`` keywords: SGLang's are ``sglang_engine.limits.report_fields``)."""

    def __init__(self, settings: AgentSettings, status: Collector, versions: dict[str, str | None],
                 limits: dict, local_gpu_index: int):
        self.settings = settings
        self.versions = versions
        self.limits = dict(limits)
        self.boot_id = new_boot_id()
        self.roles: dict[str, RoleWatch] = {}
        self._layers: dict[int, LayerCounting] = {}  # id(counted object) -> its counting
        # Called with each counted layer as it is made (the engine plugin's: e.g. recording an overflow at a cap it
        # applied at start); the plugin's entry point adds them, so the backend hooks need not know them.
        self.layer_watchers: list[Callable[[LayerCounting], None]] = []
        self.status = status
        self.role_series = RolesCollector()
        options = settings.exporter(local_gpu_index)
        self.exporter = RankExporter(self.status, self.role_series, legacy_group_label=options.legacy_group_label)
        self.exporter.serve(options)

    # --- adoption, at a dispatcher's construction (the backend's hook module) ------------------------

    def count_layer(self, counted, dispatcher, role: str, layer_id: int | None, geometry: dict, device,
                    rules: BackendCapRules, traffic: Callable[[DispatchCounters], TrafficWay],
                    traffic_stride: int | None = None, lead_per_micro_batch: bool = False,
                    split_traffic_halves: bool = False) -> LayerCounting:
        """One counted object of a dispatcher (``counted``: what ``layer_of`` finds it by), in its role's counters
        (made with the role's first layer: ``geometry``, the counters' ``device``). ``traffic(counters)``: the
        layer's way into them (the hook's choice: counter words or a record); ``rules`` name the cap's variable in
        overflow messages and say which R the cap bounds. ``traffic_stride``: the role's traffic sample
        (``dispatcher.counting.elect``: every this-many-th layer from the leader's; None, the leader's alone);
        ``split_traffic_halves``: what a sampled layer receives is counted by the next place (elect's
        ``split_halves``)."""
        watch = self.roles.get(role)
        if watch is None:
            counters = DispatchCounters(geometry["cap"], geometry["ep_size"], device, role=role)
            watch = self.roles[role] = RoleWatch(role, counters, geometry, lead_per_micro_batch=lead_per_micro_batch,
                                                 traffic_stride=traffic_stride,
                                                 split_traffic_halves=split_traffic_halves)
        counting = LayerCounting(watch.counters, geometry["ep_rank"], geometry["ep_size"], traffic(watch.counters),
                                 rules=rules)
        watch.add_layer(layer_id, counting, dispatcher)
        if watch.telemetry is not None:
            counting.on_overflow.append(watch.telemetry.on_overflow)
        self._layers[id(counted)] = counting
        for watcher in self.layer_watchers:
            watcher(counting)
        return counting

    def count_buffer(self, role: str, key: int, size_bytes: int) -> None:
        """Memory the role's layers use (a FlashInfer workspace by its data pointer, DeepEP's one buffer per process
        by its id): its bytes in the role's reports, once per ``key``."""
        self.roles[role].workspaces.setdefault(key, size_bytes)

    def layer_of(self, counted) -> LayerCounting | None:
        return self._layers.get(id(counted))

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
        except Exception:  # the counters keep counting; the engine must not notice
            logger.exception("capwatch: the %s role's reports and series did not start", role)

    def start_role(self, watch: RoleWatch) -> RankTelemetry:
        geometry = watch.geometry
        identity = RankIdentity(cluster=self.settings.cluster, ep_rank=geometry["ep_rank"],
                                ep_size=geometry["ep_size"], role=watch.role, boot_id=self.boot_id,
                                host=socket.gethostname())
        telemetry = RankTelemetry(watch.counters, identity, self.config(watch), exporter=None,
                                  reporter=self.settings.reporter(),
                                  final_report_timeout_s=self.settings.final_report_timeout_s,
                                  backend_counts=lambda: watch.backend_counts).start()
        for _, counting, _ in watch.layers:
            counting.on_overflow.append(telemetry.on_overflow)
        self.role_series.collectors.append(telemetry.collector)
        watch.telemetry = telemetry
        return telemetry

    def config(self, watch: RoleWatch) -> RankConfig:
        geometry = watch.geometry
        return rank_config(
            cap=geometry["cap"], ep_size=geometry["ep_size"], hidden_size=geometry["hidden_size"],
            top_k=geometry["top_k"], num_experts=geometry["num_experts"], **watch.reported,
            allocated_workspace_bytes=sum(watch.workspaces.values()) or None, **self.limits,
        )

    # --- capture, shutdown ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Snapshots of every role pause while the engine captures CUDA graphs."""
        with pause_snapshots(*(watch.counters for watch in self.roles.values())):
            yield

    def close(self, reason: str = "shutdown") -> None:
        for watch in self.roles.values():
            if watch.telemetry is not None:
                watch.telemetry.close(reason, self.settings.final_report_timeout_s)
        self.exporter.close()
