"""What the store remembers about one rank: its latest report's identity, config and last interval, plus
totals that survive counter resets (a new boot_id restarts the rank's cumulative counters; totals are
summed from intervals, so they never go backwards). Checkpointed as JSON (``checkpoints.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.service.sources.contract import RankState, overflow_key
from capwatch.telemetry.report import RankConfig, RankReport


@dataclass(kw_only=True)
class ReportedRank(RankState):
    """A ``RankState`` as reports tell it: the boot and sequence order the reports, so a late one updates
    the totals but not the view."""

    config: RankConfig
    boot_id: str
    boots: int = 1
    sequence: int
    sent_unix_s: float
    last_interval_end_unix_s: float
    last_interval_s: float
    last_forward_steps: int
    reports: int = 0

    def to_dict(self) -> dict:
        # Not dataclasses.asdict: its recursive deep copy cost ~1 ms per report on the ingest path.
        return {**self.__dict__, "config": self.config.model_dump(exclude_unset=False),
                "overflow_totals": dict(self.overflow_totals)}

    @classmethod
    def from_dict(cls, data: dict) -> "ReportedRank":
        """A checkpointed rank (ValueError, TypeError or KeyError: the row cannot be read). Its config is
        validated here, once; lax, as it is JSON the store wrote."""
        return cls(**{**data, "config": RankConfig.model_validate(data["config"], strict=False)})

    def copy(self) -> "ReportedRank":
        return ReportedRank(**{**self.__dict__, "overflow_totals": dict(self.overflow_totals)})


def apply_report(state: ReportedRank | None, report: RankReport, received_unix_s: float) -> ReportedRank:
    """The rank's state after one NEW (not duplicate) report; late reports update totals only."""
    identity, interval = report.identity, report.interval
    if state is None:
        state = ReportedRank(
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
