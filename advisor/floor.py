"""The smallest cap the deployment can run with, and which of its terms binds.

SGLang 0.5.22 and 0.5.23 refuse to start when the cap is below ``_required_flashinfer_a2a_dispatch_tokens_per_rank``
(``arg_groups/moe_hook.py`` ``validate_flashinfer_a2a_token_budget``): the largest of

- the prefill buffer (``max_prefill_buffer_tokens``: the chunked-prefill size) and
- the prefill CUDA-graph batch — both only when ``disaggregation_mode != "decode"`` —, and
- the largest decode/verify CUDA-graph batch x the tokens each request dispatches per step
  (``_decode_graph_dispatch_tokens_per_rank``: the speculative draft tokens, else 1; none on a prefill server).

SGLang 0.5.19 - 0.5.21 have no such check (``SGLangLimits.floor_rule == "capwatch"``): the plugin computed
the same terms, and with FlashInfer the prefill chunk is none of them there (those releases send eager prefill
through an all-gather, never through FlashInfer's A2A); below the floor a captured graph's dispatch fails at run time.
0.5.18 and older (``"capwatch_prefill"``, from their logs) have no check either, but send prefill through the A2A:
the prefill chunk is a term, and below it a prefill dispatch fails at run time.

Advice below that cannot be followed. Ranks that predate the SGLang plugin report only their CUDA-graph
decode batch and draft tokens: a batch of up to the largest captured size, each request bringing
(1 + speculative draft tokens) tokens per step; below it the first full decode batch overflows.

DeepEP has no start-up check, but the same terms bind at run time: each rank's local batch must fit its cap,
or DeepEP's dispatch assertion ends the rank — at CUDA-graph capture for the largest decode batch
(sglang#28914), at the first full prefill chunk in ``--deepep-mode low_latency`` (auto sends prefill to normal
mode, which has no cap). The backend's rules (its spec in ``backends/``) say which consequence each term has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from capwatch.advisor.stage import Step
from capwatch.sizing.backends import BackendCapRules
from capwatch.sizing.flashinfer_releases import FLASHINFER
from capwatch.telemetry.report import FloorRule, SGLangLimits

if TYPE_CHECKING:  # evidence.py measures with deployment_floor() below
    from capwatch.advisor.evidence import Evidence


FLOOR_RULES_STRICTEST_FIRST: tuple[str, ...] = get_args(FloorRule)
PREFILL_IN_FLOOR = ("sglang", "capwatch_prefill")  # the floor rules whose terms include the prefill chunk


@dataclass(frozen=True)
class Floor:
    tokens: int
    binds: str  # the term that sets it, in words
    why: str  # what happens below it


def sglang_floor_terms(limits: SGLangLimits, rules: BackendCapRules = FLASHINFER,
                       prefill_dispatched: bool = True) -> list[tuple[int, str]]:
    """SGLang's terms, as (tokens, what) — the ones that apply to this server's mode (and backend: prefill terms
    only where prefill batches go through the cap)."""
    terms = []
    if limits.disaggregation_mode != "decode" and prefill_dispatched:
        if limits.floor_rule in PREFILL_IN_FLOOR or rules.eager_prefill_dispatched:
            terms.append((limits.max_prefill_buffer_tokens,
                          f"the prefill chunk (max prefill buffer) of {limits.max_prefill_buffer_tokens} tokens"))
        if limits.prefill_cuda_graph_max_batch_size:
            terms.append((limits.prefill_cuda_graph_max_batch_size,
                          f"the prefill CUDA-graph batch of {limits.prefill_cuda_graph_max_batch_size} tokens"))
    decode = decode_graph_term(limits)
    if decode is not None:
        terms.append(decode)
    return terms


def decode_graph_term(limits: SGLangLimits) -> tuple[int, str] | None:
    """The decode/verify CUDA-graph batch x the tokens each request dispatches per step, as (tokens, what): the
    largest batch a captured graph dispatches (None on a prefill server or without decode graphs)."""
    if limits.disaggregation_mode == "prefill" or not limits.decode_cuda_graph_max_batch_size:
        return None
    batch, per_request = limits.decode_cuda_graph_max_batch_size, limits.tokens_per_request
    what = "verify" if per_request > 1 else "decode"
    return batch * per_request, (f"the {what} CUDA-graph batch {batch} x {per_request} "
                                 f"token{'s' if per_request > 1 else ''} per request")


def unchecked_shortfall(cap: int, limits: SGLangLimits | None, rules: BackendCapRules) -> tuple[int, str] | None:
    """The check SGLang does not make at start for a backend whose floor it never checks (``rules.below_floor``:
    DeepEP's low-latency cap): the decode graph term, as (tokens, what), where ``cap`` is below it; else None.
    The plugin says it at start, the service as a finding (``cap_below_decode_graph``)."""
    if rules.below_floor is None or limits is None:
        return None
    term = decode_graph_term(limits)
    return term if term is not None and cap < term[0] else None


def shortfall_text(cap: int, shortfall: tuple[int, str], rules: BackendCapRules) -> str:
    """What ``unchecked_shortfall`` found, and the fix, in the words the plugin's start line and the finding use."""
    tokens, what = shortfall
    needed = -(-tokens // rules.required_alignment) * rules.required_alignment
    fix = (f"set {rules.cap_env_var}={needed} or more, or lower the CUDA-graph batch (--cuda-graph-max-bs-decode)"
           if needed <= rules.max_cap_tokens else
           f"lower the CUDA-graph batch (--cuda-graph-max-bs-decode): {rules.cap_env_var} takes at most {rules.max_cap_tokens}")
    return f"cap {cap} is below {what} = {tokens} tokens, which SGLang does not check at start: {rules.below_floor}; {fix}"


def sglang_floor_why(limits: SGLangLimits, rules: BackendCapRules = FLASHINFER) -> str:
    """What happens below SGLang's floor, and whose computation it is."""
    if rules.below_floor is not None:  # the backend's own consequence, whatever the release
        return rules.below_floor
    if limits.floor_rule == "sglang":
        return "SGLang refuses to start below it"
    release = f"sglang {limits.sglang_version}" if limits.sglang_version else "this SGLang release"
    return (f"{release} has no start-up check: capwatch computed SGLang's rule for what reaches its A2A, "
            "and below it a dispatch fails at run time")


def deployment_floor(sglang: SGLangLimits | None, cuda_graph_max_batch_size: int | None,
                     speculative_tokens: int = 0, rules: BackendCapRules = FLASHINFER,
                     prefill_dispatched: bool = True) -> Floor | None:
    terms = []
    if sglang is not None:
        why = sglang_floor_why(sglang, rules)
        terms = [(tokens, what, why) for tokens, what in sglang_floor_terms(sglang, rules, prefill_dispatched)]
    if cuda_graph_max_batch_size is not None:
        terms.append((cuda_graph_max_batch_size * (1 + speculative_tokens),
                      f"the largest CUDA-graph decode batch {cuda_graph_max_batch_size} x "
                      f"(1 + {speculative_tokens} speculative tokens)", "a full decode batch overflows below it"))
    terms = [term for term in terms if term[0] > 0]
    if not terms:
        return None
    tokens, binds, why = max(terms, key=lambda term: term[0])  # ties: SGLang's own rule, listed first
    return Floor(tokens, binds, why)


def merged_sglang_limits(limits: Iterable[SGLangLimits | dict | None]) -> SGLangLimits | None:
    """One group's limits from its ranks' reports: each term's largest value (the cap is one number for
    all of them, so the strictest rank's rule applies). None when no rank reports them."""
    found = [item if isinstance(item, SGLangLimits) else SGLangLimits.model_validate(item, strict=False)
             for item in limits if item]
    if not found:
        return None
    modes = {item.disaggregation_mode for item in found}
    return SGLangLimits(
        sglang_version=found[0].sglang_version,
        disaggregation_mode=modes.pop() if len(modes) == 1 else "null",  # mixed modes: the full rule
        max_prefill_buffer_tokens=max(item.max_prefill_buffer_tokens for item in found),
        prefill_cuda_graph_max_batch_size=max(item.prefill_cuda_graph_max_batch_size for item in found),
        decode_cuda_graph_max_batch_size=max(item.decode_cuda_graph_max_batch_size for item in found),
        tokens_per_request=max(item.tokens_per_request for item in found),
        **merged_cap_source(found), floor_rule=_strictest_rule(item.floor_rule for item in found))


def merged_cap_source(found: list[SGLangLimits]) -> dict:
    """Who set the group's cap: the ranks' one answer where they agree (capwatch with its advice revision); where
    they do not (a ``cap_source_mismatch`` finding), the operator if any rank's was set, else SGLang's default."""
    origins = {(item.cap_source, item.advice_revision) for item in found}
    if len(origins) == 1:
        source, revision = origins.pop()
        return dict(cap_source=source, advice_revision=revision)
    return dict(cap_source="default" if all(item.cap_source == "default" for item in found) else "operator")


def _strictest_rule(rules: Iterable[str]) -> str:
    """A group of mixed releases (mid-upgrade): SGLang's own rule, the strictest, covers all of them; else the
    prefill chunk stays a term if any rank dispatches prefill through the A2A (``FloorRule`` lists them so)."""
    return min(rules, key=FLOOR_RULES_STRICTEST_FIRST.index)


def raise_to_floor(given: Evidence, sized: float) -> Step[float]:
    """Never below the floor: the server would refuse to start, or a full CUDA-graph batch would overflow."""
    floor = given.floor
    if floor is None or sized >= floor.tokens:
        return Step(sized)
    return Step(floor.tokens, (f"raised to the floor {floor.tokens}: {floor.binds} ({floor.why})",))
