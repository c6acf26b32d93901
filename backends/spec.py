"""What one A2A backend is to capwatch, in one object: its cap rules, its parameters on the wire, its pricing,
its series. Each backend module (``backends/<name>.py``) exports one ``BackendSpec``; ``capwatch.backends``
registers them, and every shared part loops over that registry instead of naming a backend."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from capwatch.series import CounterSeries, GaugeSeries, OwnSeries  # re-exported: the backend modules import them here
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.model_presets import ModelGeometry
from capwatch.sizing.price_basis import ESTIMATED, EXACT, PriceBasis
from pydantic import BaseModel


class Pricing(Protocol):
    """What a group's A2A memory costs per rank at any cap (everything but the cap fixed)."""

    ep_size: int

    def bytes_per_rank(self, cap: int) -> int: ...

    def known_bytes_per_rank(self, cap: int) -> int | None: ...

    # Optionally, ``basis_at(cap) -> PriceBasis``: where ``bytes_per_rank(cap)`` is not exact (sizing/price_basis.py).


def price_basis(pricing: Pricing, cap: int) -> PriceBasis:
    """Whether ``pricing.bytes_per_rank(cap)`` is exact or an estimate, and from what: the pricing's own
    ``basis_at`` where it has one, else exact wherever ``known_bytes_per_rank`` knows the cap."""
    basis_at = getattr(pricing, "basis_at", None)
    if basis_at is not None:
        return basis_at(cap)
    return EXACT if pricing.known_bytes_per_rank(cap) is not None else ESTIMATED


class SettingsReader(Protocol):
    """An engine's settings as the log reader reads them (SGLang's logged server args, ``sglang_logs/server_args.py``):
    leniently, a value that is no plausible setting reading as its default."""

    def text(self, key: str) -> str | None: ...

    def size(self, key: str, default: int, least: int) -> int:
        """A parallel size or a count; UnreadableArgs below ``least`` or beyond any cluster."""

    def flag(self, key: str) -> bool: ...


Side = TypeVar("Side")


def engine_side(rules: BackendCapRules, contract: type[Side]) -> Side:
    """The engine's own code for a backend (``rules.engine_side``, its module's name, bound by the engine's home), checked against what
    the backend's spec calls on it (``contract``: a runtime-checkable Protocol in the backend's module): a missing
    member fails at import, naming it, not at a user's first ``capwatch plan``."""
    side = rules.engine_side
    if isinstance(side, str):
        side = importlib.import_module(side)
    if not isinstance(side, contract):
        members = [*getattr(contract, "__annotations__", {}),
                   *(name for name, value in vars(contract).items() if callable(value) and not name.startswith("_"))]
        missing = [name for name in members if not hasattr(side, name)]
        raise TypeError(f"the engine binds no {contract.__name__} for the {rules.name} A2A "
                        f"(rules.engine_side is {getattr(side, '__name__', type(side).__name__)}; missing: {', '.join(sorted(missing)) or 'all'})")
    return side


@dataclass(frozen=True)
class RankSizes:
    """A rank's payload bytes per token and its memory at its cap, as its backend sizes them."""

    dispatch_bytes_per_token: int
    combine_bytes_per_token: int
    workspace_bytes_per_rank: int


# A backend's own series (capwatch.series, shared with the engines): BackendSpec.series, named as before.
BackendSeries = OwnSeries


@dataclass(frozen=True)
class PlanOption:
    """One of a backend's own ``capwatch plan`` options; given with another backend it is refused."""

    flag: str  # "--deepep-mode"
    dest: str  # the argparse attribute
    help: str
    metavar: str | None = None  # None: a flag without a value (store_true)


@dataclass(frozen=True)
class PlanTable:
    """What ``capwatch plan`` prints for a backend's plans: a table, then notes, then warnings (in yellow)."""

    title: str
    headers: tuple[str, ...]
    rows: list[list[str]]
    caption: str | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


# What a backend's traffic counters say most often (``BackendSpec.traffic_*``): the (token, expert) pairs of the
# top-k ids a dispatch routes, counted on the step leader's layer alone, what it sends only.
PAIRS = "one per (token, expert) pair"
LEADER_LAYER = "the step leader's layer"
SENT_ONLY = "none, sent only (the library hands the engine no per-source receive counts it can add without a host sync)"


def fits_header(budget: int | None) -> list[str]:
    """A plan table's "fits" column header: there only with a budget."""
    return ["fits"] if budget is not None else []


def fits_cell(bytes_per_rank: int, budget: int | None) -> list[str]:
    """A plan's "fits" cell: whether its ``bytes_per_rank`` is within the budget (no cell without one)."""
    return ["yes" if bytes_per_rank <= budget else "no"] if budget is not None else []


def within_budget_note(cap: int, budget: int | None) -> tuple[str, ...]:
    """A plan table's note on the largest cap within the budget (none without one)."""
    return (f"largest 128-aligned cap within budget: {cap}",) if budget is not None else ()


@dataclass(frozen=True)
class Planner:
    """What ``capwatch plan --backend NAME`` asks of a backend: its options and their help, how it plans one cap
    and the largest cap within a budget, and its table. ``options(values, geometry, ep_size, integer)`` turns the
    option values given (None where not given) into the planner's keywords, ``integer(flag, text, minimum)``
    parsing a number the way every option does; SizingError for a mistake."""

    description: str  # its paragraph of `capwatch plan --help`
    options: tuple[PlanOption, ...]
    group_title: str | None  # its options' group in --help (None: among the general options)
    ep_size_limit: str  # the group sizes it takes, in --help's words
    top_k_needed: bool  # whether a custom geometry needs --top-k
    bytes_field: str  # its plan's bytes per rank (the JSON's next_cap_<field>)
    prepare: Callable[[Mapping[str, Any], ModelGeometry, int, Callable[..., int]], dict]
    plan_at: Callable[..., Any]  # (cap=, **prepared) -> its plan (as_dict())
    largest_within: Callable[..., Any]  # (budget, alignment=, **prepared) -> the plan of the largest cap
    table: Callable[..., PlanTable]  # (plans, geometry, budget, caption) -> what to print


# A rank's config: a RankConfig (telemetry/report.py) or a source's UnpricedConfig; typed loosely here because
# both sit above this layer.
Config = Any


@dataclass(frozen=True)
class BackendSpec:
    """One A2A backend. ``params`` is the model of what prices it beyond the cap and the geometry, carried on the
    wire as ``RankConfig.<name>`` (None: the config's shared fields say all); ``series`` exports those
    parameters (None: nothing beyond the shared series)."""

    rules: BackendCapRules  # range, alignment, hard limit, what happens past them (sizing/backends.py)
    params: type[BaseModel] | None
    # What the backend refuses of a rank's config (its params included), in words; None: nothing.
    refusal: Callable[[Config], str | None]
    # What it refuses of that config in a group of ep_size ranks (the group's limits, its pricing at the cap).
    group_refusal: Callable[[Config, int], str | None]
    # The config's pricing in a group of ep_size ranks; never raises (a pricing that cannot price says so
    # through known_bytes_per_rank).
    pricing: Callable[[Config, int], Pricing]
    # The sizes a rank reports: (cap, ep_size, geometry, its params: a ``params`` instance or None). SizingError.
    sizes: Callable[[int, int, ModelGeometry, BaseModel | None], RankSizes]
    # Whether a rank's prefill batches go through this cap, from its params (None: not known).
    prefill_dispatched: Callable[[BaseModel | None], bool]
    series: BackendSeries | None = None
    planner: Planner | None = None  # capwatch plan's view of it (every registered backend has one)
    # How to read it from an engine's settings (for capwatch advise --sglang-log, which has no report): the settings
    # that size it beyond the model (hashable pairs), and from them its pricing in a group of ep_size ranks at the
    # given alignment and whether prefill batches meet its cap (SizingError saying why it cannot be priced).
    settings_params: Callable[[SettingsReader], tuple[tuple[str, object], ...]] = lambda settings: ()
    settings_pricing: Callable[[Mapping[str, object], ModelGeometry, int, int], tuple[Pricing, bool]] | None = None  # every registered backend has one (tests/backends)
    # Its params' fields were RankConfig's own before they moved under its name (the wire's first backend): a body
    # that still sends them at the top level is read (``capwatch.backends.nest_params``), and its params have
    # defaults for every field (a rank that sent none of them runs those).
    params_formerly_top_level: bool = False
    # The largest top-k and EP group its ranks can report (None: no bound of its own): the wire's bounds are the
    # largest over the registry.
    max_top_k: int | None = None
    max_ep_size: int | None = None
    # The largest EP group a rank of its default configuration runs (a config that names nothing more: the demo's
    # ranks); None: max_ep_size.
    default_max_ep_size: int | None = None
    # What its traffic counters count, for their help text (which groups the backends by each): a copy (None: one
    # per distinct target rank per token), the layers whose dispatches an engine's hooks count (None: every layer),
    # and those that count what a rank receives where they are not the same (None: the same layers).
    traffic_copies: str | None = None
    traffic_sample: str | None = None
    traffic_received_sample: str | None = None
    # The server flags an example deployment runs it with beyond ``--moe-a2a-backend <name>`` (the Kubernetes
    # example's SGLang server).
    example_server_args: tuple[str, ...] = ()
    # The words an engine's dispatcher puts before its overflow assertion (``runtime_max_tokens_per_rank...``), as
    # its log shows them: the log reader recognises the line with them.
    overflow_assertion_prefix: str | None = None
    # Where its bytes come from: "exact", capwatch sizes them offline byte for byte from the library's own
    # arithmetic; "reported", the buffer's own count at run time, exact at the rank's cap and priced in proportion
    # elsewhere (backends/reported.py).
    bytes_known: str = "exact"

    @property
    def name(self) -> str:
        return self.rules.name

    def params_of(self, config: Config) -> BaseModel | None:
        """This backend's parameters in ``config`` (None where it has none, or the config does not carry them)."""
        return getattr(config, self.name, None) if self.params is not None else None

