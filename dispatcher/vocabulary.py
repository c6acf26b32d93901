"""The dispatcher's shared names, torch-free: roles and overflow kinds/outcomes.

Kept apart from ``counters.py`` (which needs torch) so that the telemetry report schema, the
service and the CLI can use the vocabulary without importing torch (about 2 s).

``("local_over_runtime", "chunked")`` never happens (a rank with more local tokens than R is always
raised: the other ranks cannot know to chunk), but it stays in the product of kinds and outcomes
so that every exported series and report schema keeps one fixed shape.
"""

from __future__ import annotations

# sp_prefill: SGLang's sequence-parallel prefill A2A, its own workspace and counters.
ROLES = ("target", "draft", "sp_prefill")
OVERFLOW_KINDS = ("runtime_over_cap", "local_over_runtime")
OVERFLOW_OUTCOMES = ("raised", "chunked")
