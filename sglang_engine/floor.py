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
    decode = decode_graph_floor_term(limits)
    if decode is not None:
        terms.append(decode)
    return terms


def decode_graph_floor_term(limits: SGLangLimits) -> tuple[int, str] | None:
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
    The plugin says it at start (``sglang_plugin/start_check.py``), the service as a finding
    (``cap_below_decode_graph``)."""
    if rules.below_floor is None or limits is None:
        return None
    term = decode_graph_floor_term(limits)
    return term if term is not None and cap < term[0] else None


def shortfall_text(cap: int, shortfall: tuple[int, str], rules: BackendCapRules) -> str:
    """What ``unchecked_shortfall`` found, and the fix, in the words the plugin's start line and the finding use."""
    tokens, what = shortfall
    needed = -(-tokens // rules.required_alignment) * rules.required_alignment
    graph = "lower the CUDA-graph batch (--cuda-graph-max-bs-decode)"
    fix = (f"set {rules.cap_env_var}={needed} or more, or {graph}" if needed <= rules.max_cap_tokens else
           f"{graph}: {rules.cap_env_var} takes at most {rules.max_cap_tokens}")
    return (f"cap {cap} is below {what} = {tokens} tokens, which SGLang does not check at start: {rules.below_floor}; "
            f"{fix}")


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
