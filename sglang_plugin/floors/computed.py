"""The floor of a backend whose cap SGLang never checks at start-up, computed by capwatch (``floor_rule="capwatch"``).

Mooncake EP and NIXL EP: SGLang 0.5.23 asserts only ``<= 1024`` on their caps; each library's dispatch assertion
(each rank's own batch <= the cap) ends the rank at run time, at CUDA-graph capture for the largest decode batch.
capwatch computes the terms from the functions the release has (``floors/graph_terms.py``): the decode/verify
CUDA-graph batch x tokens per request, the prefill CUDA-graph batch and the prefill chunk (low-latency mode only).
"""

from __future__ import annotations

from types import SimpleNamespace

from capwatch.sglang_engine.caps import bind
from capwatch.sglang_engine.limits import SGLangLimits
from capwatch.sglang_plugin.floors.graph_terms import (
    CAPWATCH_RULE,
    COMMON,
    decode_graph_dispatch_tokens,
    sglang_limits,
)
from capwatch.sglang_plugin.releases import Target
from capwatch.sizing.backends import BackendCapRules


def computed_floor(rules: BackendCapRules, releases: tuple[str, ...] = ("0.5.23",)) -> SimpleNamespace:
    """A floor module's names (``NAME``, ``FLOOR_RULES``, ``cap_params``, ``targets``, ``limits``) for ``rules``."""
    bound = bind(rules)  # with SGLang's variable and default for its cap
    floor_rules = {release: "capwatch" for release in releases}

    def cap_params(view):
        """Nothing the floor needs beyond the shared settings (the buffer's bytes come from a rank's report)."""
        return None

    def targets(release: str) -> tuple[Target, ...]:
        return COMMON + CAPWATCH_RULE

    def limits(server_args, sglang_version: str | None, release: str) -> SGLangLimits:
        """What the cap's floor needs, resolved for this server."""
        from sglang.srt.arg_groups.model_override_base import resolved_view

        view = resolved_view(server_args)
        return sglang_limits(server_args, view, sglang_version, bound, decode_graph_dispatch_tokens(server_args, view),
                             floor_rules.get(release, "capwatch"))

    return SimpleNamespace(NAME=bound.name, FLOOR_RULES=floor_rules, cap_params=cap_params, targets=targets,
                           limits=limits, rules=bound)
