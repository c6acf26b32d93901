"""Consistency findings: the failure modes operators hit when an EP group's ranks disagree.

Ranks that disagree on the cap or ep_size (hangs, illegal memory access — sglang #30242, DeepEP #208), a
workspace sized for cap x ep_size (FlashInfer's double count of sglang PR #25907), a workspace (or DeepEP buffer)
its backend's sizing does not explain, and ranks that stopped reporting. Pure: the group's rank states and their views in,
findings out (``cluster_view.py`` puts them in the view).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Literal

from capwatch.backends import pricing_of, spec_of
from capwatch.engines import ENGINE, engine_of, limits_of
from capwatch.service.sources.contract import RankState
from capwatch.sizing.byte_units import format_gib
from capwatch.sizing.caps import align_up
from capwatch.sizing.checks import SizingError
from pydantic import BaseModel

if TYPE_CHECKING:  # cluster_view.py imports this module for Finding
    from capwatch.service.cluster_view import RankView

Severity = Literal["critical", "warning", "info"]
FINDING_KINDS = ("backend_mismatch", "cap_mismatch", "cap_source_mismatch", "cap_below_decode_graph", "ep_size_mismatch",
                 "double_counted_workspace", "missing_rank", "stale_rank", "workspace_mismatch", "cap_fallback")
# Reported bytes within this share of the cap x ep_size size count as the double count.
DOUBLE_COUNT_TOLERANCE = 0.02


class Finding(BaseModel):
    kind: str
    severity: Severity
    message: str
    ranks: list[int]


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(rank) for rank in ranks)


def _disagreement(states: list[RankState], setting: str) -> tuple[Counter, int, list[int]]:
    """How many ranks run each value of ``setting``, the majority value, and the ranks that differ from it."""
    counts = Counter(getattr(state, setting) for state in states)
    majority = counts.most_common(1)[0][0] if counts else None
    odd = sorted(state.ep_rank for state in states if getattr(state, setting) != majority)
    return counts, majority, odd


def consistency_findings(states: list[RankState], views: list[RankView], ep_size: int) -> list[Finding]:
    """``views``: one per expected rank, the states' ranks first (in ``states`` order), then never-seen ranks."""
    findings: list[Finding] = []
    live = [state for state, view in zip(states, views) if view.state != "missing"] or states
    backends = Counter(state.config.a2a_backend for state in live)
    if len(backends) > 1:
        majority = backends.most_common(1)[0][0]
        odd = sorted(state.ep_rank for state in live if state.config.a2a_backend != majority)
        findings.append(Finding(
            kind="backend_mismatch", severity="critical", ranks=odd,
            message=(f"ranks run different A2A backends: {dict(sorted(backends.items()))} (backend: ranks); one EP "
                     f"group dispatches through one backend, and each sizes its cap by its own rules, so no advice "
                     f"is given until they agree — restart rank(s) {_ranks_text(odd)} with the group's {majority}")))
    caps, majority, odd = _disagreement(live, "cap")
    if odd:
        findings.append(Finding(
            kind="cap_mismatch", severity="critical", ranks=odd,
            message=(f"ranks disagree on the cap: {dict(sorted(caps.items()))} (cap: ranks); every rank must run the "
                     f"same {majority}-token cap or dispatches can hang or read out of bounds — "
                     f"restart rank(s) {_ranks_text(odd)} with the group's value")))
    findings += _cap_source_findings(live)
    sizes, majority, odd = _disagreement(live, "ep_size")
    if odd:
        findings.append(Finding(
            kind="ep_size_mismatch", severity="critical", ranks=odd,
            message=(f"ranks disagree on ep_size: {dict(sorted(sizes.items()))} (ep_size: ranks); rank(s) "
                     f"{_ranks_text(odd)} belong to another group or were launched with a different configuration")))
    doubled, mismatched = [], []
    for state, view in zip(states, views):
        reported, expected = view.workspace_bytes_per_rank, view.expected_workspace_bytes_per_rank
        if expected is None or reported is None or reported == expected:
            continue
        # The double count is a backend's known bug (FlashInfer's cap x ep_size max_num_tokens; DeepEP takes the
        # per-rank cap as is).
        sized_for_group = (pricing_of(state.config, state.ep_size).known_bytes_per_rank(state.cap * state.ep_size)
                           if state.ep_size > 1 and spec_of(state.config.a2a_backend).rules.sized_for_group_bug
                           else None)
        if sized_for_group and abs(reported - sized_for_group) <= DOUBLE_COUNT_TOLERANCE * sized_for_group:
            doubled.append((state, reported, expected))
        elif abs(reported - expected) > DOUBLE_COUNT_TOLERANCE * expected:
            mismatched.append((state, reported, expected))
    if doubled:
        state, reported, expected = doubled[0]
        findings.append(Finding(
            kind="double_counted_workspace", severity="warning", ranks=sorted(s.ep_rank for s, _, _ in doubled),
            message=(f"rank {state.ep_rank} holds {format_gib(reported)} of A2A workspace, the size for "
                     f"cap x ep_size = {state.cap * state.ep_size} tokens per rank; its cap of {state.cap} needs only "
                     f"{format_gib(expected)} — the per-rank cap was multiplied by ep_size twice "
                     f"(as in {ENGINE.SIZED_FOR_GROUP_BUG}); size the workspace with the per-rank cap")))
    if mismatched:
        state, reported, expected = mismatched[0]
        rules = spec_of(state.config.a2a_backend).rules
        findings.append(Finding(
            kind="workspace_mismatch", severity="info", ranks=sorted(s.ep_rank for s, _, _ in mismatched),
            message=(f"rank {state.ep_rank} reports {reported} {rules.memory} bytes; {rules.sized_by} gives "
                     f"{expected} for its configuration ({rules.mismatch_hint})")))
    findings += _fallback_findings(live)
    missing = sorted(view.ep_rank for view in views if view.state == "missing")
    if missing:
        findings.append(Finding(
            kind="missing_rank", severity="critical", ranks=missing,
            message=(f"{len(missing)} of {ep_size} ranks are missing (never reported, or silent too long): "
                     f"{_ranks_text(missing)}; the view and advice only cover the others")))
    stale = sorted(view.ep_rank for view in views if view.state == "stale")
    if stale:
        findings.append(Finding(
            kind="stale_rank", severity="warning", ranks=stale,
            message=f"rank(s) {_ranks_text(stale)} have not reported recently; their numbers may be out of date"))
    return findings


def _fallback_findings(live: list[RankState]) -> list[Finding]:
    """Ranks of a backend that runs a step above its cap on a slower path instead of failing
    (``rules.over_cap_fallback``: Mega MoE) whose R went above the cap: they fell back, which nothing else shows.
    Raising the cap stops it, priced in the backend's bytes; memory for speed, no rank at risk."""
    above = {state.ep_rank: state for state in live
             if spec_of(state.config.a2a_backend).rules.over_cap_fallback is not None
             and state.max_runtime_tokens > state.cap}
    if not above:
        return []
    state = max(above.values(), key=lambda state: state.max_runtime_tokens)
    rules = spec_of(state.config.a2a_backend).rules
    needed = max(rules.alignment, align_up(state.max_runtime_tokens, rules.alignment))
    pricing = pricing_of(state.config, state.ep_size)
    try:
        price = (f"; the {rules.memory} goes from {format_gib(pricing.bytes_per_rank(state.cap))} to "
                 f"{format_gib(pricing.bytes_per_rank(needed))} per rank"
                 + ("" if pricing.known_bytes_per_rank(needed) is not None else " (in proportion, an estimate)"))
    except SizingError:
        price = ""
    return [Finding(
        kind="cap_fallback", severity="info", ranks=sorted(above),
        message=(f"rank(s) {_ranks_text(sorted(above))} ran steps with R up to {state.max_runtime_tokens} tokens per "
                 f"rank, above the cap {state.cap}: there the {rules.name} A2A {rules.over_cap_fallback}, with no "
                 f"error and nothing logged. Set {rules.env_line(needed)} to stop the fallback{price}: memory for "
                 "speed, no rank is at risk"))]


def _cap_source_findings(live: list[RankState]) -> list[Finding]:
    """Ranks (of those that say, under the SGLang plugin) that disagree on who set their cap or on the advice revision
    capwatch applied (two nodes started from different advice), and ranks whose cap is below the decode CUDA-graph
    batch their backend never checks at start (``sglang_engine.floor.unchecked_shortfall``)."""
    findings = []
    told = [(state, limits) for state in live if (limits := limits_of(state.config)) is not None]
    origins = {state.ep_rank: engine_of(limits).cap_source_text(limits.cap_source, limits.advice_revision,
                                                                spec_of(state.config.a2a_backend).rules.cap_env_var)
               for state, limits in told}
    counts = Counter(origins.values())
    if len(counts) > 1:
        majority = counts.most_common(1)[0][0]
        odd = sorted(rank for rank, origin in origins.items() if origin != majority)
        by_origin = "; ".join(f"{origin}: rank(s) {_ranks_text(sorted(r for r, o in origins.items() if o == origin))}"
                              for origin in sorted(counts))
        findings.append(Finding(
            kind="cap_source_mismatch", severity="warning", ranks=odd,
            message=(f"ranks disagree on who set the cap or on the advice revision — {by_origin}; one group must start "
                     f"from one decision: restart rank(s) {_ranks_text(odd)} with the group's ({majority})")))
    short = {}
    for state, limits in told:
        shortfall = engine_of(limits).unchecked_shortfall(state.cap, limits, spec_of(state.config.a2a_backend).rules)
        if shortfall is not None:
            short[state.ep_rank] = (state, shortfall, engine_of(limits))
    if short:
        state, shortfall, engine = short[min(short)]
        findings.append(Finding(
            kind="cap_below_decode_graph", severity="warning", ranks=sorted(short),
            message=f"rank {state.ep_rank}'s " + engine.shortfall_text(state.cap, shortfall,
                                                                       spec_of(state.config.a2a_backend).rules)))
    return findings
