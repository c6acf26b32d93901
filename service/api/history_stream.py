"""``GET /v1/clusters/{cluster}/history``'s answer, streamed: each rank's series, then the group's peak per window,
written a page of rows at a time as the client reads (``ClusterSource.interval_pages``). A request holds one page,
never the whole range: 100 clients asking for 100,000 intervals each and not reading took the service from 65 MB
to 5.2 GB when each answer was built whole.

The group's windows come from the rows in time order, a window at a time: its rows are complete once a row of a
later window comes, and ``group_samples`` (the window rule, once) makes the same sample of them as of all the
rows at once. The JSON is ``ClusterHistory``'s (``routes/clusters.py``), field for field."""

from __future__ import annotations

from collections.abc import Iterator

from capwatch.advisor.sample import RankInterval, group_samples, window_start
from capwatch.service.sources.contract import ClusterSource, IntervalRow
from pydantic_core import to_json

# Rows read and written at a time: what one request holds (about 100 KB of rows and their JSON).
PAGE_ROWS = 500


def _point(row: IntervalRow) -> dict:
    return {"interval_end_unix_s": row.interval_end_unix_s, "peak_runtime_tokens": row.peak_runtime_tokens,
            "cap": row.cap, "utilization": row.peak_runtime_tokens / row.cap, "forward_steps": row.forward_steps,
            "overflow_events": row.overflow_events, "max_local_tokens": row.max_local_tokens}


def _ranks(pages: Iterator[list[IntervalRow]]) -> Iterator[bytes]:
    """``"ranks":[{"ep_rank":0,"points":[...]},...]`` from rows by rank then time. Each rank's points of a page are
    serialised in one call (one call per row was most of a large answer's time)."""
    yield b'"ranks":['
    current, written = None, False
    for page in pages:
        parts: list[bytes] = []
        run: list[dict] = []
        for row in page:
            if row.ep_rank != current:
                if run:
                    parts.append((b"," if written else b"") + to_json(run)[1:-1])
                    run = []
                parts.append(b"" if current is None else b"]},")
                parts.append(b'{"ep_rank":%d,"points":[' % row.ep_rank)
                current, written = row.ep_rank, False
            run.append(_point(row))
        if run:
            parts.append((b"," if written else b"") + to_json(run)[1:-1])
            written = True
        yield b"".join(parts)
    yield b"]" if current is None else b"]}]"


def _windows(pages: Iterator[list[IntervalRow]], window_s: float) -> Iterator[bytes]:
    """``"group":[...]``: one point per window in which some interval ran steps, from rows by time."""

    def points(rows: list[IntervalRow]) -> list[dict]:
        samples = group_samples((RankInterval(row.ep_rank, row.interval_end_unix_s, row.peak_runtime_tokens, row.cap,
                                              row.overflow_events, row.forward_steps) for row in rows), window_s)
        return [{"window_start_unix_s": sample.window_start_s, "peak_runtime_tokens": sample.peak_runtime_tokens,
                 "cap": sample.cap, "utilization": sample.peak_runtime_tokens / sample.cap,
                 "overflow_events": sample.overflow_events, "ranks": len(sample.ranks)} for sample in samples]

    yield b'"group":['
    first, window, pending = True, None, []
    for page in pages:
        done = []
        for row in page:
            start = window_start(row.interval_end_unix_s, window_s)
            if start != window and pending:
                done.extend(points(pending))
                pending = []
            window = start
            pending.append(row)
        if done:
            yield (b"" if first else b",") + to_json(done)[1:-1]
            first = False
    last = points(pending)
    yield ((b"" if first or not last else b",") + to_json(last)[1:-1] if last else b"") + b"]"


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
