"""The service's own words: the advisor's verdicts and a rank's status as the service sees it."""

from __future__ import annotations

from typing import Literal, get_args

# The advisor's verdict on the cap.
Action = Literal["raise", "lower", "hold", "insufficient_data"]
# A rank as the service sees it: reporting, late (stale) or gone (missing).
RankStatus = Literal["reporting", "stale", "missing"]

ACTIONS: tuple[Action, ...] = get_args(Action)
RANK_STATUSES: tuple[RankStatus, ...] = get_args(RankStatus)
