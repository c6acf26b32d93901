"""The service's own words: a rank's status as the service sees it, and why it drops a connection. (The
advisor's verdict, ``Action``, is the advisor's word: ``capwatch.advisor.vocabulary``.)"""

from __future__ import annotations

from typing import Literal, get_args

# A rank as the service sees it: reporting, late (stale) or gone (missing).
RankStatus = Literal["reporting", "stale", "missing"]
# Why capwatch serve's HTTP protocol closes a connection (service/http_server.py): the
# capwatch_connections_dropped_total{reason} label.
DropReason = Literal["too_many_connections", "header_timeout", "header_too_large", "pipelined", "malformed_request",
                     "not_reading", "evicted_idle", "evicted_slow"]

RANK_STATUSES: tuple[RankStatus, ...] = get_args(RankStatus)
DROP_REASONS: tuple[DropReason, ...] = get_args(DropReason)
