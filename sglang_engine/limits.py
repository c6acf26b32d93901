"""``SGLangLimits``: what an SGLang rank reports of its cap's floor inputs (``RankConfig.sglang`` on the wire)."""

from __future__ import annotations

from typing import Annotated, Literal

from capwatch.sizing.caps import MAX_CAP_TOKENS
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# Who computed SGLang's floor and what happens below it: SGLang at start-up, or capwatch for a release without
# the check, with or without the prefill chunk as a term. Strictest first: a group of mixed releases takes the
# first its ranks report (sglang_engine/floor.py).
FloorRule = Literal["sglang", "capwatch_prefill", "capwatch"]
MAX_TOKENS_PER_REQUEST = 1024  # no speculative config drafts more per step
# Who set the cap a rank's dispatcher was built with: capwatch at SGLang's start (CAPWATCH_APPLY, with the advice
# revision), the operator (the variable set before capwatch ran, or by hand), or SGLang's default (unset).
CAP_SOURCES = ("capwatch", "operator", "default")
LEGACY_CAP_SOURCES = {"env": "operator"}  # before capwatch could set a cap, "env" meant the operator set it
MAX_ADVICE_REVISION = 1 << 53  # exact in the page's JavaScript numbers, as the report's counts


def _legacy_cap_source(source):
    return LEGACY_CAP_SOURCES.get(source, source) if isinstance(source, str) else source


CapSource = Annotated[Literal[CAP_SOURCES], BeforeValidator(_legacy_cap_source)]  # type: ignore[valid-type]


def cap_source_text(source: str, revision: int | None, cap_variable: str) -> str:
    """Who set a cap, in the words the plugin's start line, ``/advice``, the page and ``capwatch advise`` use."""
    if source == "capwatch":  # capwatch records a revision with every cap it applies; a hand-made report may not
        return "applied by capwatch at start" + ("" if revision is None else f" (revision {revision})")
    if source == "operator":
        return f"set by the operator ({cap_variable})"
    return f"SGLang's default ({cap_variable} unset)"


class SGLangLimits(BaseModel):
    """What SGLang's start-up check needs to accept a cap, as SGLang resolved it on this rank.

    sglang 0.5.23 ``arg_groups/moe_hook.py`` ``validate_flashinfer_a2a_token_budget`` refuses to start
    when the cap is below ``_required_flashinfer_a2a_dispatch_tokens_per_rank``: the largest of the
    prefill buffer (``max_prefill_buffer_tokens``) and the prefill CUDA-graph batch — both only when
    ``disaggregation_mode != "decode"`` — and the largest decode/verify CUDA-graph batch times the
    tokens each request dispatches per step (``_decode_graph_dispatch_tokens_per_rank``). The advisor
    never recommends below that; the plugin and the log reader fill these fields the way SGLang does.

    ``floor_rule`` says who computed the floor's terms and what happens below them: ``sglang`` (its own
    functions, 0.5.22 on: it refuses to start below them), ``capwatch`` (sglang 0.5.19 - 0.5.21 have no
    such check: capwatch computes the same rule for the batches that reach that release's A2A — its
    eager prefill goes through an all-gather, so the prefill chunk is no term there — and below it a
    dispatch fails at run time instead) or ``capwatch_prefill`` (0.5.18 and older, read from their logs:
    no check either, but eager prefill goes through the A2A, so the prefill chunk is a term; below it a
    dispatch fails at run time).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # The engine these limits are of (RankConfig carries each engine's under its name). Accepted on input, left
    # out of the JSON a rank sends, so a service of an older release (which refuses unknown keys) still takes it.
    engine: Literal["sglang"] = Field("sglang", exclude=True)
    sglang_version: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    max_prefill_buffer_tokens: Annotated[int, Field(ge=0, le=MAX_CAP_TOKENS)] = 0
    prefill_cuda_graph_max_batch_size: Annotated[int, Field(ge=0, le=MAX_CAP_TOKENS)] = 0
    decode_cuda_graph_max_batch_size: Annotated[int, Field(ge=0, le=MAX_CAP_TOKENS)] = 0
    tokens_per_request: Annotated[int, Field(ge=1, le=MAX_TOKENS_PER_REQUEST)] = 1
    # Who set the cap (CAP_SOURCES): capwatch at start, the backend's variable as the operator set it
    # (SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK, ...), or SGLang's default when the variable is unset.
    # "env", from ranks older than capwatch's apply, is read as "operator". The docstring above is the wire
    # schema's description.
    cap_source: CapSource = "operator"
    floor_rule: FloorRule = "sglang"
    # The revision of the advice capwatch applied (cap_source "capwatch"; None otherwise).
    advice_revision: Annotated[int, Field(ge=0, le=MAX_ADVICE_REVISION)] | None = None

    @model_validator(mode="after")
    def _revision_of_applied(self) -> "SGLangLimits":
        if self.advice_revision is not None and self.cap_source != "capwatch":
            raise ValueError(f"advice_revision {self.advice_revision} with cap_source {self.cap_source!r}: only a cap "
                             "capwatch applied has an advice revision")
        return self


def report_fields(limits: SGLangLimits | None) -> dict:
    """What an SGLang rank's limits add to each of its reports (``rank_config`` keywords): the limits, and the
    decode graph's batch and draft tokens every rank reports (the advisor's floor for ranks without limits)."""
    return dict(
        cuda_graph_max_batch_size=(limits.decode_cuda_graph_max_batch_size or None) if limits else None,
        speculative_tokens=(limits.tokens_per_request - 1) if limits else 0,
        sglang=limits,
    )
