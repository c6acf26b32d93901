"""SGLang's start-up floor for a backend's cap: its terms on a rank's ``SGLangLimits``, what happens below them,
and one group's limits merged from its ranks'.

SGLang 0.5.22 on refuses to start below the largest of the prefill buffer and the prefill CUDA-graph batch (off a
decode server) and the decode/verify CUDA-graph batch x tokens per request; older releases have no check and fail
at run time, with or without the prefill chunk as a term (``FloorRule``). A backend's rules say which terms reach
its cap and what happens below them. docs/advisor.md ("SGLang's floor") has the reasoning and SGLang's functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

from capwatch.sglang_engine.limits import FloorRule, SGLangLimits
from capwatch.sizing.backends import BackendCapRules


FLOOR_RULES_STRICTEST_FIRST: tuple[str, ...] = get_args(FloorRule)
PREFILL_IN_FLOOR = ("sglang", "capwatch_prefill")  # the floor rules whose terms include the prefill chunk


def sglang_floor_terms(limits: SGLangLimits, rules: BackendCapRules,
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


def sglang_floor_why(limits: SGLangLimits, rules: BackendCapRules) -> str:
    """What happens below SGLang's floor, and whose computation it is."""
    if rules.below_floor is not None:  # the backend's own consequence, whatever the release
        return rules.below_floor
    if limits.floor_rule == "sglang":
        return "SGLang refuses to start below it"
    release = f"sglang {limits.sglang_version}" if limits.sglang_version else "this SGLang release"
    return (f"{release} has no start-up check: capwatch computed SGLang's rule for what reaches its A2A, "
            "and below it a dispatch fails at run time")


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
