"""What every source of cluster data hands the views and the advisor: the ``ClusterSource`` protocol and
its rows.

Two sources implement it: the report-fed SQLite store (``store/sqlite.py``), and a Prometheus server that
scrapes the ranks (``sources/prometheus/source.py``). A source says what it does not know rather than
inventing it: Prometheus sees no boot ids (``None``), and from an exporter older than the geometry gauges,
or from series no rank could have reported together, no model geometry (an ``UnpricedConfig``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import NamedTuple, Protocol

from capwatch.advisor.history import SampleHistory
from capwatch.backends import DEFAULT_BACKEND, SPECS
from capwatch.engines import ENGINES
from capwatch.telemetry.report import RankConfig


class SourceUnavailable(RuntimeError):
    """The source could not answer (say, Prometheus is down); the API turns this into 503."""


@dataclass(frozen=True)
class _UnpricedFields:
    cap: int
    dispatch_bytes_per_token: int | None  # None: not known, so not priced
    combine_bytes_per_token: int | None
    workspace_bytes_per_rank: int | None
    backend: str = "unknown"
    overflow_policy: str = "raise"
    allocated_workspace_bytes: int | None = None
    cuda_graph_max_batch_size: int | None = None
    speculative_tokens: int = 0
    a2a_backend: str = DEFAULT_BACKEND.name
    hidden_size: None = None  # not known: see UnpricedConfig
    top_k: None = None
    num_experts: None = None


# A rank's config without the model geometry: priced by the layout whose inputs are the bytes per token and its
# backend's parameters alone (FlashInfer's ``moe_a2a``), never by a guessed geometry. The fields mean what
# ``RankConfig``'s do, each engine's limits and each backend's parameters under its name as there (None: not known,
# or not its rank).
UnpricedConfig = dataclasses.make_dataclass(
    "UnpricedConfig", [*((engine.NAME, f"{engine.LIMITS.__name__} | None", None) for engine in ENGINES.values()),
                       *((spec.name, f"{spec.params.__name__} | None", None)
                         for spec in SPECS.values() if spec.params is not None)],
    bases=(_UnpricedFields,), frozen=True)
UnpricedConfig.__module__ = __name__


@dataclass(kw_only=True)
class RankState:
    """One rank as its source last saw it (never mutated once a source has handed it out)."""

    cluster: str
    role: str
    ep_rank: int
    ep_size: int
    host: str | None
    received_unix_s: float  # when the source last heard from the rank
    config: RankConfig | UnpricedConfig
    last_peak_runtime_tokens: int
    max_runtime_tokens: int  # since the source first saw the rank, across boots
    overflow_totals: dict[str, int] = field(default_factory=dict)  # "kind/outcome" -> events
    forward_steps_total: int = 0
    # The rank's own largest local batch (None: the rank does not report it).
    last_max_local_tokens: int | None = None
    max_local_tokens: int | None = None  # since the source first saw the rank, across boots
    final: bool = False
    final_reason: str | None = None
    boot_id: str | None = None  # None: the source does not see the rank's boots
    boots: int | None = None

    @property
    def cap(self) -> int:
        return self.config.cap

    @property
    def overflow_events_total(self) -> int:
        return sum(self.overflow_totals.values())


def overflow_key(kind: str, outcome: str) -> str:
    """The key of ``RankState.overflow_totals``."""
    return f"{kind}/{outcome}"


class IntervalRow(NamedTuple):
    """One rank's interval (a report's, or a window's from Prometheus) for the history view. A tuple: the history
    streams up to 100,000 of them per answer, and a tuple is built from a database row in C (``interval_rows_of``)."""

    ep_rank: int
    interval_end_unix_s: float
    peak_runtime_tokens: int
    cap: int
    forward_steps: int
    overflow_events: int
    max_local_tokens: int | None = None  # the rank's own largest local batch (None: not reported)


def interval_rows_of(rows: list[tuple]) -> list[IntervalRow]:
    """Database rows whose first columns are ``IntervalRow``'s fields (in its order; more may follow) as rows,
    without a Python call per row."""
    return list(map(_as_interval_row, map(_interval_fields, rows)))


_as_interval_row = partial(tuple.__new__, IntervalRow)
_interval_fields = itemgetter(slice(0, len(IntervalRow._fields)))


# What ``interval_pages`` gives: whether ``limit`` left rows out, and an iterator of pages per order asked for.
IntervalPages = tuple[bool, list[Iterator[list[IntervalRow]]]]
# How the history orders a group's rows: each rank's series (by rank, then time), or the group's windows (by time).
ROW_ORDERS = {"rank": lambda row: (row.ep_rank, row.interval_end_unix_s),
              "time": lambda row: (row.interval_end_unix_s, row.ep_rank)}


def pages_of(rows: list[IntervalRow], limit: int, orders: tuple[str, ...], page_rows: int) -> IntervalPages:
    """``interval_pages`` for a source that reads its (bounded) rows at once: the list, ordered and cut."""
    def pages(order: str) -> Iterator[list[IntervalRow]]:
        ordered = sorted(rows, key=ROW_ORDERS[order])
        for start in range(0, len(ordered), page_rows):
            yield ordered[start:start + page_rows]

    return len(rows) >= limit, [pages(order) for order in orders]


class ClusterChanges(Protocol):
    """An optional capability of a source: a version of each cluster's committed data and a log of which clusters
    changed. The store has it (every commit, fold and prune bumps the cluster's generation and is logged); with it
    the service's digests are recomputed only for what changed (``service/digests.py``)."""

    def generation(self, cluster: str) -> int:
        """Changes whenever the cluster's committed data does."""
        ...

    def changed_since(self, mark: int) -> tuple[int, list[str]]:
        """The clusters whose committed data changed after ``mark`` (0: the start), and the next mark."""
        ...


class ClusterSource(Protocol):
    def changes(self) -> ClusterChanges | None:
        """The source's versions and log of changes (``ClusterChanges``), or None where it keeps none (Prometheus,
        which caches its own queries): every read then computes anew."""
        ...

    def clusters(self) -> list[str]: ...
    def rank_states(self, cluster: str) -> list[RankState]: ...
    def sample_history(self, cluster: str, role: str) -> SampleHistory: ...
    def interval_rows(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                      limit: int) -> list[IntervalRow]: ...

    def interval_pages(self, cluster: str, role: str, since_unix_s: float, until_unix_s: float, limit: int,
                       orders: tuple[str, ...], page_rows: int = 2000) -> IntervalPages:
        """The rows ``interval_rows`` gives, in pages, once per order of ``ROW_ORDERS`` asked for; and whether
        ``limit`` left some out. What ``GET /history`` streams: a request holds a page, never the whole range."""
        ...
