"""SGLang as an engine, for the rest of capwatch (``capwatch.engines`` registers it): its name, the wire model of
its limits and what the advisor does with them, so no shared part names SGLang."""

from __future__ import annotations

from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.deployment import server_example
from capwatch.sglang_engine.floor import (
    merged_sglang_limits,
    shortfall_text,
    sglang_floor_terms,
    sglang_floor_why,
    unchecked_shortfall,
)
from capwatch.sglang_engine.limits import SGLangLimits, cap_source_text, report_fields
from capwatch.sglang_engine.memory import ReservePrice, over_reserve_text
from capwatch.sglang_engine.series import SERIES

NAME = "sglang"  # RankConfig.<NAME> carries a rank's limits; SGLangLimits.engine says the same
TITLE = "SGLang"  # the engine in messages
LIMITS = SGLangLimits
SERIES = SERIES  # its own series (moe_a2a_<NAME>_info, a gauge per floor term), read from its LIMITS
merged_limits = merged_sglang_limits  # one group's limits from its ranks' (None: no rank reports them)
floor_terms = sglang_floor_terms  # (limits, rules, prefill_dispatched) -> [(tokens, what)]
floor_why = sglang_floor_why  # (limits, rules) -> what happens below the floor
limits_report_fields = report_fields  # (limits or None) -> rank_config keywords
bind_rules = bind  # a backend's cap rules -> the same with the engine's variable, default, reserve, words and side
cap_source_text = cap_source_text  # (cap_source, advice_revision, cap variable) -> who set the cap, in words
unchecked_shortfall = unchecked_shortfall  # (cap, limits, rules) -> the decode graph term a cap misses, unchecked
shortfall_text = shortfall_text  # (cap, shortfall, rules) -> that, in words
RESERVE_PRICE = ReservePrice  # the advice's price beyond the engine's own reserve (a base of advisor.advice.Price)
over_reserve_text = over_reserve_text  # (reserve, over, mem_fraction_static) -> that reserve and what to set, in words
server_example = server_example  # (a2a_backend, its server args, GPUs) -> the server the Kubernetes example runs
# The module that adds the engine's log reader to `capwatch advise` (its options, checks and reader), imported by
# name by the command line only: the log reader sits above this package.
LOG_READER = "capwatch.sglang_logs.command"
# The engine's bug that sized a backend's workspace for cap x ep_size (BackendCapRules.sized_for_group_bug).
SIZED_FOR_GROUP_BUG = "sglang PR #25907"

__all__ = ["LIMITS", "LOG_READER", "NAME", "RESERVE_PRICE", "SERIES", "SIZED_FOR_GROUP_BUG", "TITLE", "bind_rules",
           "cap_source_text", "floor_terms", "floor_why", "limits_report_fields", "merged_limits", "over_reserve_text",
           "server_example", "shortfall_text", "unchecked_shortfall"]
