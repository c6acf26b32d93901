"""The advisor's own words: its verdict on the cap. The service and the log reader spell it from here."""

from __future__ import annotations

from typing import Literal, get_args

# The advisor's verdict on the cap.
# "set": the cap in use is unknown (a log read without --cap shows no overflow assertion), so the advice is the cap
# to set and its bounds, no move from one the advisor would have to guess (advice.Deployment.cap_known).
Action = Literal["raise", "lower", "hold", "insufficient_data", "set"]

ACTIONS: tuple[Action, ...] = get_args(Action)
