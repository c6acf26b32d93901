"""``GET /v1/clusters/{cluster}/history`` side by side (issue 36, F20: history reads 8 - 10x slower): the service's
own streamer (``service/api/history_stream.py``) over one group of 8 ranks x 2,500 intervals (the issue's
``since_s=1&limit=100000``, ~3.4 MB of JSON), on two copies of one database in alternating rounds in one process:

- ``covering``: the schema as it is (version 4: each page read from a covering index alone);
- ``table_rows``: the same rows with version 3's indexes (e0cc95d's: every row of a page looked up in the table,
  past its large payload, to reach ``max_local_tokens``);
- the control, in the same rounds: serialising a fixed list of 20,000 points (no database): the machine's own
  drift between rounds.

Figures: the median milliseconds per answer of each, their ratio, and the answer's bytes (both answers are
checked to be the same bytes).

    python -m benchmarks history_read [--quick] [--json]
"""

from __future__ import annotations

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
            times: dict[str, list[float]] = {"covering": [], "table_rows": [], "control": []}
            for _ in range(rounds):
                for name, call in (("table_rows", lambda: _answer(table_rows)), ("covering", lambda: _answer(covering)),
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
               "table_rows_over_covering": round(medians["table_rows"] / medians["covering"], 2)}
    print(f"history of {figures['rows']:,} intervals ({len(answer) / 1e6:.1f} MB), median of {rounds} rounds: "
          f"covering index {medians['covering']} ms, table rows (e0cc95d's indexes) {medians['table_rows']} ms "
          f"(x{figures['table_rows_over_covering']}); control {medians['control']} ms")
    return figures
