"""``GET /v1/clusters/{cluster}/history``'s answer, streamed: each rank's series, then the group's peak per window,
written a page of rows at a time as the client reads (``ClusterSource.interval_pages``). A request holds one page
and one piece of JSON, never the whole range: 100 clients asking for 100,000 intervals each and not reading took
the service from 65 MB to 5.2 GB when each answer was built whole.

The group's windows come from the rows in time order, a window at a time (``samples_in_time_order``: the window
rule, once): the same samples as of all the rows at once. The JSON is ``ClusterHistory``'s (``routes/clusters.py``),
field for field, written by one format per point: building a dict per row and serialising it was most of a large
answer's time (issue 36, F20; ``benchmarks/history_read.py``).

Every piece is made in the history's own few worker threads (``HistoryWorkers``), taken in turn, never in the
thread pool the other routes share: 2,000 clients reading a large history slowly had 40 pool threads making
pieces at once, and the event loop, short of the GIL, answered neither ``/healthz`` nor a rank's report (F19)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from operator import attrgetter
from typing import TypeVar

import anyio
from capwatch.advisor.sample import samples_in_time_order
from capwatch.service.sources.contract import ClusterSource, IntervalRow
from pydantic_core import to_json

# Rows read from the source at a time, and points written in one piece (~20 KB of JSON): what one request holds.
PAGE_ROWS = 256
PIECE_POINTS = 64
# Threads making history pieces at once, for every request together: each piece is a few ms of CPU, so two keep
# the answers moving while the event loop keeps the GIL often enough to answer everyone else.
HISTORY_THREADS = 2

# One point of a rank's series (HistoryPoint) and of the group's (GroupPoint); %r writes a float as JSON does.
_RANK_POINT = ('{"interval_end_unix_s":%r,"peak_runtime_tokens":%r,"cap":%r,"utilization":%r,"forward_steps":%r,'
               '"overflow_events":%r,"max_local_tokens":%s}')
_GROUP_POINT = ('{"window_start_unix_s":%r,"peak_runtime_tokens":%r,"cap":%r,"utilization":%r,"overflow_events":%r,'
                '"ranks":%d}')


def _rank_points(rows: list[IntervalRow]) -> list[str]:
    """Each row's point, without a call per row (a large answer is 100,000 of them)."""
    return [_RANK_POINT % (end, peak, cap, peak / cap, steps, overflows, "null" if local is None else repr(local))
            for _, end, peak, cap, steps, overflows, local in rows]


def _ranks(pages: Iterator[list[IntervalRow]]) -> Iterator[bytes]:
    """``"ranks":[{"ep_rank":0,"points":[...]},...]`` from rows by rank then time."""
    parts, current, size = ['"ranks":['], None, 0
    for page in pages:
        start = 0
        while start < len(page):  # the page's run of each rank
            rank = page[start].ep_rank
            end = start + 1
            while end < len(page) and page[end].ep_rank == rank:
                end += 1
            if rank != current:
                parts.append(('' if current is None else ']},') + '{"ep_rank":%d,"points":[' % rank)
            else:
                parts.append(",")
            parts.append(",".join(_rank_points(page[start:end])))
            size += end - start
            current, start = rank, end
        page = None  # noqa: F841 (not held while the piece waits for the client)
        if size >= PIECE_POINTS:
            yield "".join(parts).encode()
            parts, size = [], 0
    parts.append("]" if current is None else "]}]")
    yield "".join(parts).encode()


def _time_ordered_rows(pages: Iterator[list[IntervalRow]]) -> Iterator[IntervalRow]:
    for page in pages:
        yield from page


def _windows(pages: Iterator[list[IntervalRow]], window_s: float) -> Iterator[bytes]:
    """``"group":[...]``: one point per window in which some interval ran steps, from rows by time."""
    parts, separator = ['"group":['], ""
    for sample in samples_in_time_order(_time_ordered_rows(pages), window_s, attrgetter("interval_end_unix_s")):
        parts.append(separator + _GROUP_POINT % (sample.window_start_s, sample.peak_runtime_tokens, sample.cap,
                                                 sample.peak_runtime_tokens / sample.cap, sample.overflow_events,
                                                 len(sample.ranks)))
        separator = ","
        if len(parts) >= PIECE_POINTS:
            yield "".join(parts).encode()
            parts = []
    parts.append("]")
    yield "".join(parts).encode()


def history_json(source: ClusterSource, cluster: str, role: str, since_unix_s: float, until_unix_s: float,
                 limit: int, window_s: float) -> Iterator[bytes]:
    """The answer's pieces. Which rows is fixed now (a source that cannot answer raises here, before anything is
    sent: SourceUnavailable is a 503); their pages are read as the client takes the pieces."""
    truncated, (by_rank, by_time) = source.interval_pages(cluster, role, since_unix_s, until_unix_s, limit,
                                                          ("rank", "time"), PAGE_ROWS)
    head = {"cluster": cluster, "role": role, "since_unix_s": since_unix_s, "until_unix_s": until_unix_s,
            "window_s": window_s, "truncated": truncated}

    def pieces() -> Iterator[bytes]:
        yield to_json(head)[:-1] + b","
        yield from _ranks(by_rank)
        yield b","
        yield from _windows(by_time, window_s)
        yield b"}"

    return pieces()


T = TypeVar("T")


class HistoryWorkers:
    """The threads that read and write history answers (``HISTORY_THREADS`` at once, shared by every request, in
    the order they asked): one per app (``app.state.history_workers``), so a crowd of history clients waits its
    turn here instead of filling the pool the other routes use."""

    def __init__(self, threads: int = HISTORY_THREADS):
        self.limiter = anyio.CapacityLimiter(threads)

    async def call(self, function: Callable[..., T], *args) -> T:
        return await anyio.to_thread.run_sync(function, *args, limiter=self.limiter)

    async def pieces(self, pieces: Iterator[bytes]) -> AsyncIterator[bytes]:
        """``pieces``, each made in a worker when the client has taken the one before (the server holds at most
        its output buffer for a client: ``capwatch.service.http_server``)."""
        while True:
            piece = await self.call(next, pieces, None)
            if piece is None:
                return
            yield piece
