"""The advisor's own words: its verdict on the cap. The service and the log reader spell it from here."""

from __future__ import annotations

from typing import Literal, get_args

# The advisor's verdict on the cap.
Action = Literal["raise", "lower", "hold", "insufficient_data"]

ACTIONS: tuple[Action, ...] = get_args(Action)
