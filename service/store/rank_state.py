"""What the service remembers about one rank: its latest report's identity, config and last
interval, plus totals that survive counter resets (a new boot_id restarts the rank's cumulative
counters; totals are summed from intervals, so they never go backwards)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from capwatch.telemetry.report import RankConfig, RankReport


def config_of(config: RankConfig | Mapping) -> RankConfig:
    """A rank's config as the typed model. A mapping is validated (lax: it comes from JSON the store
    wrote); one without the model geometry (a Prometheus source cannot see it) is kept unvalidated,
    so only the layouts that price without a geometry price it."""
    if isinstance(config, RankConfig):
        return config
    try:
        return RankConfig.model_validate(config, strict=False)
    except ValidationError:
        if all(name in config for name in ("hidden_size", "top_k", "num_experts")):
            raise  # a full config that does not validate: a damaged row, reported by the store
        return RankConfig.model_construct(**config)


@dataclass
class RankState:
    cluster: str
    role: str
    ep_rank: int
    ep_size: int
    boot_id: str
    sequence: int
    host: str | None
    sent_unix_s: float
    received_unix_s: float
    config: RankConfig  # frozen: shared between copies
    last_interval_end_unix_s: float
    last_interval_s: float
    last_forward_steps: int
    last_peak_runtime_tokens: int
    max_runtime_tokens: int  # since the service first saw the rank, across boots
    final: bool = False
    final_reason: str | None = None
    overflow_totals: dict[str, int] = field(default_factory=dict)  # "kind/outcome" -> events
    forward_steps_total: int = 0
    reports: int = 0
    boots: int = 1
    # The rank's own largest local batch (the report's max_local_tokens; None from ranks that predate it).
    last_max_local_tokens: int | None = None
    max_local_tokens: int | None = None  # since the service first saw the rank, across boots

    def __post_init__(self) -> None:
        self.config = config_of(self.config)

    @property
    def cap(self) -> int:
        return self.config.cap

    @property
    def overflow_events_total(self) -> int:
        return sum(self.overflow_totals.values())

    def to_dict(self) -> dict:
        # Not dataclasses.asdict: its recursive deep copy cost ~1 ms per report on the ingest path.
        return {**self.__dict__, "config": self.config.model_dump(exclude_unset=False),
                "overflow_totals": dict(self.overflow_totals)}

    def copy(self) -> "RankState":
        return RankState(**{**self.__dict__, "overflow_totals": dict(self.overflow_totals)})

    @classmethod
    def from_dict(cls, data: dict) -> "RankState":
        return cls(**data)


def overflow_key(kind: str, outcome: str) -> str:
    return f"{kind}/{outcome}"


def apply_report(state: RankState | None, report: RankReport, received_unix_s: float) -> RankState:
    """The rank's state after one NEW (not duplicate) report; late reports update totals only."""
    identity, interval = report.identity, report.interval
    if state is None:
        state = RankState(
            cluster=identity.cluster, role=identity.role, ep_rank=identity.ep_rank, ep_size=identity.ep_size,
            boot_id=identity.boot_id, sequence=-1, host=identity.host, sent_unix_s=-1.0,
            received_unix_s=received_unix_s, config=report.config, last_interval_end_unix_s=0.0,
            last_interval_s=0.0, last_forward_steps=0, last_peak_runtime_tokens=0, max_runtime_tokens=0, boots=1)
    for event in interval.overflow_events:
        key = overflow_key(event.kind, event.outcome)
        state.overflow_totals[key] = state.overflow_totals.get(key, 0) + event.count
    state.forward_steps_total += interval.forward_steps
    state.reports += 1
    state.max_runtime_tokens = max(state.max_runtime_tokens, interval.peak_runtime_tokens)
    if interval.max_local_tokens is not None:
        state.max_local_tokens = max(state.max_local_tokens or 0, interval.max_local_tokens)
    new_boot = identity.boot_id != state.boot_id
    newer = (report.sequence > state.sequence) if not new_boot else (report.sent_unix_s >= state.sent_unix_s)
    if not newer:
        return state  # a late report of an older boot or sequence: counted, but the view stays
    if new_boot:
        state.boots += 1  # the rank restarted: its cumulative counters begin again from zero
    state.boot_id = identity.boot_id
    state.sequence = report.sequence
    state.ep_size = identity.ep_size
    state.host = identity.host
    state.sent_unix_s = report.sent_unix_s
    state.received_unix_s = received_unix_s
    state.config = report.config
    state.last_interval_end_unix_s = interval.end_unix_s
    state.last_interval_s = interval.end_unix_s - interval.start_unix_s
    state.last_forward_steps = interval.forward_steps
    state.last_peak_runtime_tokens = interval.peak_runtime_tokens
    state.last_max_local_tokens = interval.max_local_tokens
    state.final = report.final
    state.final_reason = report.final_reason
    return state
