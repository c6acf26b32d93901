"""What the advisor answers: an ``Advice`` built from typed parts, each made by one piece of the chain, and the
what-if rows. The JSON is flat — every part's fields side by side, then the reasons — as ``/advice``,
``capwatch advise --json`` and the web page read it; each field is declared once, in its part."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from capwatch.advisor.vocabulary import Action
from capwatch.backends import DEFAULT_BACKEND
from capwatch.engines import ENGINE
from pydantic import BaseModel


class Decision(BaseModel):
    """What to do (``hysteresis.decide``): the action, the cap, and the band it was weighed against."""

    action: Action
    recommended_cap: int | None
    target_cap: int | None  # the estimate before hysteresis (what "hold" declined to move to)
    lower_bound: int | None
    upper_bound: int | None
    confidence: float
    env: str | None  # the line that sets the recommended cap
    # VPA's LowConfidence condition: less covered history than a change inside the bounds waits for
    # (CAPWATCH_ADVISOR__CHANGE_MIN_HISTORY_S); the first reason says so.
    low_confidence: bool = False

    @classmethod
    def insufficient_data(cls) -> Decision:
        return cls(action="insufficient_data", recommended_cap=None, target_cap=None, lower_bound=None,
                   upper_bound=None, confidence=0.0, env=None)


# Where the current cap comes from: the ranks' reports, --cap, a log's overflow assertion (its max_num_tokens), or
# assumed (SGLang's default for a log that shows neither: not known, see Deployment.cap_known).
CapSource = Literal["reported", "flag", "assertion", "assumed"]


# Who set the cap the ranks run (their SGLangLimits.cap_source, where they agree; "mixed" where they do not).
CapSetBy = Literal["capwatch", "operator", "default", "mixed"]


class Deployment(BaseModel):
    """What the group runs now and what bounds any cap for it: known before any history."""

    a2a_backend: str = DEFAULT_BACKEND.name  # whose cap (its spec, capwatch.backends)
    cap_variable: str = DEFAULT_BACKEND.rules.cap_env_var  # the variable that sets it
    current_cap: int  # where cap_known is false, an assumed value: nothing is priced or decided against it
    ep_size: int
    # The MoE geometry that prices the cap (the ranks' dispatchers: experts and top-k counting fused shared and
    # redundant experts; a log's model: its config's): what a tool applying the advice at start checks it is for
    # this model. None where not known (advice from before these fields, ranks that did not report them).
    hidden_size: int | None = None
    num_experts: int | None = None
    top_k: int | None = None
    workspace_bytes_per_rank_current: int | None  # None where the cap in use is unknown
    workspace_bytes_group_current: int | None
    # Whether those bytes are exact (a reported-bytes buffer: the cap in use is the cap they were reported at) or an
    # estimate; None where they are not priced.
    workspace_bytes_exact_current: bool | None = None
    floor_cap: int | None
    floor_binds: str | None = None  # which term of the floor sets it
    budget_cap: int | None
    kv_bytes_per_token: int | None = None
    # The range every cap for this group lies in, advised or asked about (the page's what-if reads it):
    # 1..max_cap_tokens, the backend's largest (its spec, capwatch.backends); advised caps are multiples of cap_alignment.
    max_cap_tokens: int | None = None
    cap_alignment: int | None = None
    # False: the cap in use is unknown (a log read without --cap and without an overflow assertion). The action is
    # then "set", and nothing may apply this advice to a running deployment on its own: a later tool that applies
    # advice at SGLang's start must refuse it (the value to set is right; what it replaces is not known).
    cap_known: bool = True
    cap_source: CapSource = "reported"
    # What the evidence bounds the cap in use by: the largest batch that ran without an overflow assertion (every
    # backend asserts above its cap). None where nothing bounds it.
    cap_at_least: int | None = None
    mem_fraction_static: float | None = None  # the server's --mem-fraction-static, where known (a log's args)
    # Who set the cap the ranks run (None: no rank says — no SGLang plugin), the advice revision capwatch applied, and
    # both in words: "applied by capwatch at start (revision N)", "set by the operator (VAR)", "SGLang's default".
    cap_set_by: CapSetBy | None = None
    cap_advice_revision: int | None = None
    cap_origin: str | None = None


class Coverage(BaseModel):
    """How much history the advice stands on."""

    sample_count: int
    overflow_windows: int
    history_s: float  # first to last sample: stretched by gaps and by a rank clock far off
    covered_history_s: float  # what the history gates use: min(history_s, sample_count x window)
    max_peak_runtime_tokens: int


class Forecast(BaseModel):
    """What the history predicts at the current and the recommended cap: the share of windows above each, the
    expected overflowing windows per day (``tail.py``) with the recommended cap's band, and the trend."""

    predicted_overflow_rate_current: float | None
    predicted_overflow_rate_recommended: float | None
    predicted_overflow_windows_per_day_current: float | None = None
    predicted_overflow_windows_per_day_recommended: float | None = None
    predicted_overflow_windows_per_day_recommended_low: float | None = None
    predicted_overflow_windows_per_day_recommended_high: float | None = None
    tail_fit: bool = False  # a generalized Pareto tail was fitted (else the empirical histogram predicts)
    trend_rate_per_day: float | None = None  # ln-growth of daily peaks per day (Theil-Sen), when measured
    trend_significant: bool = False


class WorkspacePrice(BaseModel):
    """The recommended cap's workspace bytes, and the KV-cache tokens they free (``kv.py``)."""

    workspace_bytes_per_rank_recommended: int | None
    workspace_bytes_group_recommended: int | None
    workspace_bytes_group_delta: int | None
    kv_cache_tokens_per_rank_freed: int | None = None  # > 0: the change frees room for that many KV tokens


class PriceBasisPart(BaseModel):
    """Whether the price's bytes are exact or an estimate (``advisor/pricing.py`` ``price_basis``), after the
    engine's reserve in the JSON (added fields come last)."""

    # Whether the recommended cap's bytes are exact (None: nothing priced). A reported-bytes backend's buffer
    # (backends/reported.py) is exact only at the cap a rank reported it for; at any other cap it is priced in
    # proportion, an estimate, and so are the group delta and the KV-cache tokens priced from it.
    workspace_bytes_exact_recommended: bool | None = None
    # This price in words: "exact", or where any of its figures is not, how it was made ("estimated in proportion to
    # the X GiB per rank reported at cap N, exact only there"; FlashInfer 0.7.4 as built: "a lower bound: ...");
    # None where nothing is priced.
    workspace_bytes_basis: str | None = None
    # The cap whose reported (or built) bytes an estimated price is made from; None where the price is exact.
    workspace_bytes_reported_cap: int | None = None


# The workspace's fields, then the engine's, then their basis (pydantic lists a later base's fields first).
class Price(PriceBasisPart, ENGINE.RESERVE_PRICE, WorkspacePrice):
    """What the recommended cap costs: workspace bytes, the KV-cache tokens they free, the bytes beyond the
    engine's own reserve for the backend's buffer (the engine's ``RESERVE_PRICE``), and whether they are exact."""

    @classmethod
    def none(cls) -> Price:
        return cls(workspace_bytes_per_rank_recommended=None, workspace_bytes_group_recommended=None,
                   workspace_bytes_group_delta=None)


# The parts, in the order their fields appear (pydantic lists a later base's fields first).
class Advice(Price, Forecast, Coverage, Deployment, Decision):
    reasons: list[str]

    @classmethod
    def of(cls, decision: Decision, deployment: Deployment, coverage: Coverage, forecast: Forecast, price: Price,
           reasons: Iterable[str]) -> Advice:
        parts = (decision, deployment, coverage, forecast, price)
        return cls(**{name: value for part in parts for name, value in part}, reasons=list(reasons))


class ClusterAdvice(Advice):
    """What ``GET /v1/clusters/{cluster}/advice`` answers (and ``capwatch advise --json`` prints)."""

    cluster: str
    role: str
    generated_unix_s: float

    @classmethod
    def of_group(cls, advice: Advice, cluster: str, role: str, generated_unix_s: float) -> ClusterAdvice:
        return cls(**dict(advice), cluster=cluster, role=role, generated_unix_s=generated_unix_s)


class WhatIf(BaseModel):
    cap: int
    predicted_overflow_rate: float | None
    workspace_bytes_per_rank: int
    workspace_bytes_group: int
    workspace_bytes_group_delta: int | None  # None where the cap in use is unknown
    aligned: bool
    below_floor: bool
    within_budget: bool | None
    predicted_overflow_windows_per_day: float | None = None
    predicted_overflow_windows_per_day_low: float | None = None
    predicted_overflow_windows_per_day_high: float | None = None
    kv_cache_tokens_per_rank_freed: int | None = None  # against the current cap (< 0: the cap costs KV room)
    # Whether this cap's bytes are exact or an estimate (a reported-bytes buffer away from its reported cap)
    workspace_bytes_exact: bool | None = None
