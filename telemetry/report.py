"""The interval report a rank posts to the service (``POST /v1/reports``).

Defined once here; the reporter builds it and the service validates it with the same models.
Strict: ints must be JSON integers (no floats, no NaN), unknown fields are refused, and the
cross-field checks below reject anything that cannot come from a real rank.
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from capwatch.backends import BACKEND_NAMES, DEFAULT_BACKEND, MAX_EP_SIZE, MAX_TOP_K, SPECS, nest_params, spec_of
from capwatch.engines import ENGINES
from capwatch.sizing.caps import MAX_CAP_TOKENS
from capwatch.sizing.checks import INT32_MAX, MAX_HIDDEN_SIZE, MAX_NUM_EXPERTS
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    model_validator,
)

from capwatch.vocabulary import OVERFLOW_KINDS, OVERFLOW_OUTCOMES, OverflowKind, OverflowOutcome, OverflowPolicy, Role

SCHEMA_VERSION = 1

# Bounds on what a real deployment can report; anything beyond is a bug or an attack. MAX_TOP_K and
# MAX_EP_SIZE (capwatch.backends): the largest over the backends (each one's own bound is its refusal).
MAX_WORKSPACE_BYTES = 1 << 42  # 4 TiB
# 2^53: exact in the web page's JavaScript numbers, centuries of tokens at any real rate, and small
# enough that every sum the store keeps of them (a report's overflow kinds and outcomes, a window's
# reports, saturated at MAX_STORED_COUNT) fits SQLite's int64: no legal report can fail a commit.
MAX_COUNT = 1 << 53
MAX_STORED_COUNT = 1 << 62
# R and a rank's local batch: FlashInfer holds token counts in int32.
MAX_TOKENS = INT32_MAX

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"


def not_a_relative_path(name: str) -> str:
    """``.`` and ``..`` match the pattern but are path steps: the page's relative URLs would leave the cluster."""
    if name in (".", ".."):
        raise ValueError(f"{name!r} is a path step, not a name; use letters, digits or _ . : - with at least one "
                         "character other than '.'")
    return name


Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN), AfterValidator(not_a_relative_path)]
A2ABackend = Literal[BACKEND_NAMES]  # type: ignore[valid-type]  # capwatch.backends: one spec per backend


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RankIdentity(_Strict):
    cluster: Name
    ep_rank: Annotated[int, Field(ge=0, lt=MAX_EP_SIZE)]  # each release's own limit: RankReport's check
    ep_size: Annotated[int, Field(ge=1, le=MAX_EP_SIZE)]
    role: Role = "target"
    boot_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    host: Annotated[str, Field(max_length=255)] | None = None

    @model_validator(mode="after")
    def _rank_in_group(self) -> "RankIdentity":
        if self.ep_rank >= self.ep_size:
            raise ValueError(f"ep_rank {self.ep_rank} must be < ep_size {self.ep_size}")
        return self


class _RankConfigFields(_Strict):
    """A rank's configuration: the fields every backend shares. ``RankConfig`` adds one field per backend with
    parameters of its own (``BackendSpec.params``), named by the backend, set on that backend's ranks alone
    (FlashInfer's ``flashinfer``, DeepEP's ``deepep``); ``a2a_backend`` says which one a rank runs."""

    cap: Annotated[int, Field(ge=1, le=MAX_CAP_TOKENS)]
    hidden_size: Annotated[int, Field(ge=1, le=MAX_HIDDEN_SIZE)]
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)]
    num_experts: Annotated[int, Field(ge=1, le=MAX_NUM_EXPERTS)]
    backend: Annotated[str, Field(min_length=1, max_length=64)]
    overflow_policy: OverflowPolicy = "raise"
    dispatch_bytes_per_token: Annotated[int, Field(ge=1, le=1 << 24)]
    combine_bytes_per_token: Annotated[int, Field(ge=1, le=1 << 24)]
    workspace_bytes_per_rank: Annotated[int, Field(ge=1, le=MAX_WORKSPACE_BYTES)]
    allocated_workspace_bytes: Annotated[int, Field(ge=1, le=MAX_WORKSPACE_BYTES)] | None = None
    # Floor inputs for the advisor: the largest CUDA-graph decode batch and draft tokens per step.
    cuda_graph_max_batch_size: Annotated[int, Field(ge=1, le=MAX_CAP_TOKENS)] | None = None
    speculative_tokens: Annotated[int, Field(ge=0, le=64)] = 0
    # The A2A backend whose cap this is (SGLang's --moe-a2a-backend name): its variable, bounds and pricing.
    a2a_backend: A2ABackend = DEFAULT_BACKEND.name

    @model_validator(mode="before")
    @classmethod
    def _params_under_their_backend(cls, data):
        """A backend's parameters sent at the top level by reports of before they moved under its name (stored
        ones, older plugins): read there (``capwatch.backends.nest_params``)."""
        return nest_params(data) if isinstance(data, dict) else data

    # What the rank's backend would refuse of it (its parameters' own checks ran in their model). The group-level
    # check is RankReport's.
    @model_validator(mode="after")
    def _backend_accepts(self) -> "_RankConfigFields":
        spec = spec_of(self.a2a_backend)
        stray = next((other for other in SPECS.values() if other is not spec and other.params_of(self) is not None),
                     None)
        refusal = (f"a {self.a2a_backend} rank reports no {stray.name} parameters (a2a_backend {stray.name!r} does)"
                   if stray is not None else spec.refusal(self))
        if refusal is not None:
            raise ValueError(refusal)
        return self


# The wire's config: the shared fields, then each engine's limits under its name (set by that engine's plugin: the
# inputs of its start-up floor for the cap), then each backend's parameters under its name (None on other ranks).
RankConfig = create_model(
    "RankConfig", __base__=_RankConfigFields, __module__=__name__,
    **{engine.NAME: (engine.LIMITS | None, None) for engine in ENGINES.values()},
    **{spec.name: (spec.params | None, None) for spec in SPECS.values() if spec.params is not None})


def __getattr__(name: str):
    """Each engine's limits model under its own name, as this module re-exported them before they moved to their
    engine's home. Kept for code outside the repository: this module is the documented report schema
    (docs/report.md), and a reporter of one's own built ``RankConfig``'s limits from it. capwatch's own code and
    tests import them from the engine's home (``capwatch.sglang_engine.limits``)."""
    limits = {engine.LIMITS.__name__: engine.LIMITS for engine in ENGINES.values()}
    if name in limits:
        return limits[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class OverflowCount(_Strict):
    kind: OverflowKind
    outcome: OverflowOutcome
    count: Count


class CumulativeCounters(_Strict):
    """Totals since the rank booted (reset when boot_id changes)."""

    dispatch_calls: Count
    forward_steps: Count
    tokens_sent: Count
    tokens_received: Count
    max_runtime_tokens: Tokens
    overflow_events: Annotated[list[OverflowCount], Field(max_length=len(OVERFLOW_KINDS) * len(OVERFLOW_OUTCOMES))] = []


class Interval(_Strict):
    """What happened since the previous report. ``runtime_tokens_histogram`` is sparse:
    ``[[R, steps], ...]`` with R ascending; R == cap + 1 stands for every R above the cap."""

    start_unix_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    end_unix_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    forward_steps: Count
    dispatch_calls: Count
    peak_runtime_tokens: Tokens
    # This rank's own largest local batch (tokens it dispatched in one step, not the group's R): the
    # per-rank line that shows which rank drives the group's peak. None from ranks that predate it.
    max_local_tokens: Tokens | None = None
    runtime_tokens_histogram: Annotated[list[tuple[Count, Count]], Field(max_length=MAX_CAP_TOKENS + 2)] = []
    overflow_events: Annotated[list[OverflowCount], Field(max_length=len(OVERFLOW_KINDS) * len(OVERFLOW_OUTCOMES))] = []

    @model_validator(mode="after")
    def _consistent(self) -> "Interval":
        if self.end_unix_s < self.start_unix_s:
            raise ValueError("interval end_unix_s is before start_unix_s")
        previous = -1
        steps = 0
        for runtime_tokens, count in self.runtime_tokens_histogram:
            if runtime_tokens <= previous:
                raise ValueError("runtime_tokens_histogram bins must be strictly ascending")
            if count == 0:
                raise ValueError("runtime_tokens_histogram lists only non-empty bins")
            previous = runtime_tokens
            steps += count
        if steps != self.forward_steps:
            raise ValueError(
                f"runtime_tokens_histogram holds {steps} steps but interval forward_steps is {self.forward_steps}"
            )
        if self.max_local_tokens is not None and self.max_local_tokens > self.peak_runtime_tokens:
            raise ValueError(f"max_local_tokens {self.max_local_tokens} exceeds peak_runtime_tokens "
                             f"{self.peak_runtime_tokens}: R is the largest local batch of the group, this rank's included")
        return self


class RankReport(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    identity: RankIdentity
    sequence: Count  # per boot_id, from 0; (boot_id, sequence) makes retries idempotent
    sent_unix_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    config: RankConfig
    counters: CumulativeCounters
    interval: Interval
    final: bool = False  # the last report before the rank exits
    final_reason: Annotated[str, Field(max_length=2000)] | None = None

    @model_validator(mode="after")
    def _fits_cap(self) -> "RankReport":
        top_bin = self.config.cap + 1
        if self.interval.runtime_tokens_histogram and self.interval.runtime_tokens_histogram[-1][0] > top_bin:
            raise ValueError(
                f"runtime_tokens_histogram bin {self.interval.runtime_tokens_histogram[-1][0]} exceeds "
                f"cap + 1 = {top_bin} (the over-cap bin)"
            )
        if self.interval.forward_steps > self.counters.forward_steps:
            raise ValueError("interval forward_steps exceeds the cumulative forward_steps")
        if self.interval.peak_runtime_tokens > self.counters.max_runtime_tokens:
            raise ValueError("interval peak_runtime_tokens exceeds the cumulative max_runtime_tokens")
        check_priceable(self.config, self.identity.ep_size)
        return self


def check_priceable(config: RankConfig, ep_size: int) -> None:
    """The config prices in a group of ``ep_size`` ranks (the release's rank limit, experts per rank):
    every accepted report can be priced and advised. Raises ``ValueError`` saying what its backend refuses."""
    refusal = _pricing_refusal(config, ep_size)
    if refusal is not None:
        raise ValueError(refusal)


@functools.lru_cache(maxsize=4096)
def _pricing_refusal(config: RankConfig, ep_size: int) -> str | None:
    # Cached by value (the model is frozen, so hashable): a rank sends the same config in every report,
    # and pricing it was most of a report's validation time.
    refusal = spec_of(config.a2a_backend).group_refusal(config, ep_size)
    return None if refusal is None else f"config with identity.ep_size {ep_size}: {refusal}"
