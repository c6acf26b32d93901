"""SGLang's side of each A2A backend's per-rank cap: how a rank names its backend in its reports."""

from __future__ import annotations

from capwatch.sizing.backends import BackendCapRules


def reported_backend(rules: BackendCapRules) -> str:
    """The ``backend`` an SGLang plugin rank reports: the engine and SGLang's name of the A2A."""
    return f"sglang-{rules.name}"
