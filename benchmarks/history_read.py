"""``GET /v1/clusters/{cluster}/history`` side by side (issue 36, F20: history reads 8 - 10x slower): the service's
own streamer (``service/api/history_stream.py``) over one group of 8 ranks x 2,500 intervals (the issue's
``since_s=1&limit=100000``, ~3.4 MB of JSON), on two copies of one database in alternating rounds in one process:

- ``covering``: the schema as it is (version 4: each page read from a covering index alone);
- ``table_rows``: the same rows with version 3's indexes (e0cc95d's: every row of a page looked up in the table,
  past its large payload, to reach ``max_local_tokens``);
- ``previous_code``: the covering index, answered by the streamer as it was before issue 36's F20 mend (a dict
  per row serialised by pydantic, the window rule per row; copied below as the reference);
- the control, in the same rounds: serialising a fixed list of 20,000 points (no database): the machine's own
  drift between rounds.

Figures: the median milliseconds per answer of each, their ratios, and the answer's bytes (the answers are checked
to be the same JSON).

    python -m benchmarks history_read [--quick] [--json]
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

VERSION_3_INDEXES = """
DROP INDEX IF EXISTS reports_by_rank_rows;
DROP INDEX IF EXISTS reports_by_time_rows;
CREATE INDEX reports_by_time ON reports (cluster, role, interval_end_unix_s);
CREATE INDEX reports_by_rank ON reports (cluster, role, ep_rank, interval_end_unix_s);
"""


# The streamer before the F20 mend (service/api/history_stream.py at 17eaa53), for the side-by-side figure.
def _previous_answer(store) -> bytes:
    from capwatch.advisor.sample import RankInterval, group_samples, window_start
    from pydantic_core import to_json

    def _point(row: object) -> dict:
        return {"interval_end_unix_s": row.interval_end_unix_s, "peak_runtime_tokens": row.peak_runtime_tokens,
                "cap": row.cap, "utilization": row.peak_runtime_tokens / row.cap, "forward_steps": row.forward_steps,
                "overflow_events": row.overflow_events, "max_local_tokens": row.max_local_tokens}

    def _ranks(pages: Iterator[list[object]]) -> Iterator[bytes]:
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

    def _windows(pages: Iterator[list[object]], window_s: float) -> Iterator[bytes]:
        """``"group":[...]``: one point per window in which some interval ran steps, from rows by time."""

        def points(rows: list[object]) -> list[dict]:
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

    truncated, (by_rank, by_time) = store.interval_pages("deep", "target", 1.0, 4e9, 100_000, ("rank", "time"), 500)
    head = {"cluster": "deep", "role": "target", "since_unix_s": 1.0, "until_unix_s": 4e9, "window_s": 60.0,
            "truncated": truncated}
    return b"".join([to_json(head)[:-1] + b",", *_ranks(by_rank), b",", *_windows(by_time, 60.0), b"}"])


def _answer(store) -> bytes:
    from capwatch.service.api.history_stream import history_json

    return b"".join(history_json(store, "deep", "target", 1.0, 4e9, 100_000, 60.0))  # a fixed range: same bytes


def _control(points: list[dict]) -> None:
    from pydantic_core import to_json

    to_json(points)


def run(quick: bool = False) -> dict:
    import benchmarks.connection_flood as flood
    from capwatch.service.store.sqlite import Store

    rounds = 3 if quick else 9
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        original_clusters = flood.CLUSTERS
        flood.CLUSTERS = 1  # only the deep group matters here
        try:
            filled = flood._filled_database(folder)
        finally:
            flood.CLUSTERS = original_clusters
        covering_path, table_path = folder / "covering.db", folder / "table_rows.db"
        shutil.copy(filled, covering_path)
        shutil.copy(filled, table_path)
        covering = Store(covering_path)
        table_rows = Store(table_path)  # migrated to version 4 on open; then given version 3's indexes back
        with sqlite3.connect(table_path) as connection:
            connection.executescript(VERSION_3_INDEXES)
        points = [{"interval_end_unix_s": 1.7e9 + index, "peak_runtime_tokens": index % 400, "cap": 1024,
                   "utilization": 0.1, "forward_steps": 30, "overflow_events": 0, "max_local_tokens": None}
                  for index in range(20_000)]
        try:
            answer = _answer(covering)
            if _answer(table_rows) != answer:
                raise AssertionError("the two databases gave different answers")
            if json.loads(_previous_answer(covering)) != json.loads(answer):
                raise AssertionError("the previous streamer gave a different answer")
            times: dict[str, list[float]] = {"covering": [], "table_rows": [], "previous_code": [], "control": []}
            for _ in range(rounds):
                for name, call in (("table_rows", lambda: _answer(table_rows)), ("covering", lambda: _answer(covering)),
                                   ("previous_code", lambda: _previous_answer(covering)),
                                   ("control", lambda: _control(points))):
                    started = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - started)
        finally:
            covering.close()
            table_rows.close()
    medians = {name: round(statistics.median(values) * 1000, 1) for name, values in times.items()}
    figures = {"rounds": rounds, "answer_bytes": len(answer), "rows": flood.HISTORY_RANKS * flood.HISTORY_INTERVALS,
               **{f"{name}_median_ms": value for name, value in medians.items()},
               "table_rows_over_covering": round(medians["table_rows"] / medians["covering"], 2),
               "previous_code_over_covering": round(medians["previous_code"] / medians["covering"], 2)}
    print(f"history of {figures['rows']:,} intervals ({len(answer) / 1e6:.1f} MB), median of {rounds} rounds: "
          f"covering index {medians['covering']} ms, table rows (e0cc95d's indexes) {medians['table_rows']} ms "
          f"(x{figures['table_rows_over_covering']}), the previous streamer on the covering index "
          f"{medians['previous_code']} ms (x{figures['previous_code_over_covering']}); control {medians['control']} ms")
    return figures
