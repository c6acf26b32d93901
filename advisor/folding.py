"""What a group's windows become in its history: the advisor's rule, whatever keeps the windows.

A source hands over the group's windows (``GroupSample``, one per window by the window rule of
``sample.py``) and, when it keeps one, the history older windows were folded into. Each window is one
sample; an overflowing one also adds its bump (``history.overflow_bump``). The report-fed store keeps
recent windows as rows and folds the old ones here (``fold``), persisting only the result; a
Prometheus source has no folded history and builds it from its windows each time (``history_of``).
"""

from __future__ import annotations

from collections.abc import Iterable

from capwatch.advisor.history import SampleHistory
from capwatch.advisor.policy import AdvisorPolicy
from capwatch.advisor.sample import GroupSample


def empty_history(policy: AdvisorPolicy, window_s: float) -> SampleHistory:
    return SampleHistory(policy.half_life_s, window_s=window_s)


def history_of(folded: SampleHistory | None, windows: Iterable[GroupSample], policy: AdvisorPolicy,
               window_s: float) -> SampleHistory:
    """The group's history: ``folded`` (None: nothing folded yet; not changed) with each window added."""
    history = empty_history(policy, window_s) if folded is None else folded.copy()
    return history.add_all(windows, policy.bump_factor, policy.bump_min_tokens)


def fold(folded: SampleHistory | None, windows: Iterable[GroupSample], policy: AdvisorPolicy, window_s: float,
         now_s: float) -> SampleHistory:
    """``history_of``, then the buckets whose weight decayed below ``forget_relative_weight`` of a fresh
    sample are forgotten: what the store keeps in place of windows it no longer keeps."""
    history = history_of(folded, windows, policy, window_s)
    history.forget_below(policy.forget_relative_weight, now_s)
    return history
