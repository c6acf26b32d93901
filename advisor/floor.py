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
    if limits.disaggregation_mode != "prefill" and limits.decode_cuda_graph_max_batch_size:
        batch, per_request = limits.decode_cuda_graph_max_batch_size, limits.tokens_per_request
        what = "verify" if per_request > 1 else "decode"
        terms.append((batch * per_request, f"the {what} CUDA-graph batch {batch} x {per_request} "
                                           f"token{'s' if per_request > 1 else ''} per request"))
    return terms


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
        cap_source="env" if any(item.cap_source == "env" for item in found) else "default",
        floor_rule=_strictest_rule(item.floor_rule for item in found))


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
