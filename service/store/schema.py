"""SQLite schema, versioned with ``PRAGMA user_version``. Raw reports are kept for the retention
window; per-window group samples for the fold window; older samples live only in one bounded
decaying histogram per cluster/role.

``MIGRATIONS[n]`` takes a database from version n to n + 1, in one transaction that also sets the
version, so a crash mid-migration leaves the previous version. A database from before versions
existed reads 0 and has version 1's tables already (its statements are all IF NOT EXISTS). Add a
migration at the end, never edit one: databases in the field were written by each of them.
"""

import functools

from capwatch.advisor.sample import SUM_LIMIT, WINDOW_FIELDS, Combine

SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY,
    cluster TEXT NOT NULL,
    role TEXT NOT NULL,
    ep_rank INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    received_unix_s REAL NOT NULL,
    interval_end_unix_s REAL NOT NULL,
    peak_runtime_tokens INTEGER NOT NULL,
    cap INTEGER NOT NULL,
    forward_steps INTEGER NOT NULL,
    overflow_events INTEGER NOT NULL,
    payload TEXT NOT NULL,
    -- a retried report (same boot and sequence) is acknowledged and ignored
    UNIQUE (cluster, role, ep_rank, boot_id, sequence)
);
CREATE INDEX IF NOT EXISTS reports_by_time ON reports (cluster, role, interval_end_unix_s);

CREATE TABLE IF NOT EXISTS ranks (
    cluster TEXT NOT NULL,
    role TEXT NOT NULL,
    ep_rank INTEGER NOT NULL,
    state TEXT NOT NULL,  -- JSON of RankState
    PRIMARY KEY (cluster, role, ep_rank)
);

-- Rank states are derived from the reports: checkpointed every few seconds, and on start the
-- reports after the checkpoint are replayed, so a batch commit does not re-serialise every rank.
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    last_report_id INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS windows (
    cluster TEXT NOT NULL,
    role TEXT NOT NULL,
    window_start_s REAL NOT NULL,
    peak_runtime_tokens INTEGER NOT NULL,
    cap INTEGER NOT NULL,
    overflow_events INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    PRIMARY KEY (cluster, role, window_start_s)
);

CREATE TABLE IF NOT EXISTS folded (
    cluster TEXT NOT NULL,
    role TEXT NOT NULL,
    history TEXT NOT NULL,  -- JSON of SampleHistory
    PRIMARY KEY (cluster, role)
);

-- Every window that started before this has been folded: a late report for one adds no window row.
CREATE TABLE IF NOT EXISTS fold_progress (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    folded_before_s REAL NOT NULL
);
"""

# Version 2: each rank's own largest local batch per interval (the per-rank line of the history),
# and the ranks' last receive time as a column, so ranks missing longer than the retention are pruned
# by an indexed query instead of parsing every state.
SCHEMA_V2 = """
ALTER TABLE reports ADD COLUMN max_local_tokens INTEGER;
ALTER TABLE ranks ADD COLUMN received_unix_s REAL NOT NULL DEFAULT 0;
UPDATE ranks SET received_unix_s = coalesce(json_extract(state, '$.received_unix_s'), 0)
    WHERE json_valid(state);
CREATE INDEX IF NOT EXISTS ranks_by_received ON ranks (received_unix_s);
"""

# Version 3: the reports of a group by rank then time, so the history streams each rank's series a page at a
# time (reads.interval_pages) instead of sorting the whole range for every page.
SCHEMA_V3 = """
CREATE INDEX IF NOT EXISTS reports_by_rank ON reports (cluster, role, ep_rank, interval_end_unix_s);
"""

# Version 4: the history's two orders read from covering indexes (every column a history row needs, after the
# key): a page is read from the index alone, never from the table rows, whose large payload sits before
# max_local_tokens (issue 36, F20: history reads 8 - 10x slower; benchmarks/history_read.py).
HISTORY_ROW_COLUMNS = "id, peak_runtime_tokens, cap, forward_steps, overflow_events, max_local_tokens"
SCHEMA_V4 = f"""
DROP INDEX IF EXISTS reports_by_rank;
DROP INDEX IF EXISTS reports_by_time;
CREATE INDEX IF NOT EXISTS reports_by_rank_rows ON reports (cluster, role, ep_rank, interval_end_unix_s,
    {HISTORY_ROW_COLUMNS});
CREATE INDEX IF NOT EXISTS reports_by_time_rows ON reports (cluster, role, interval_end_unix_s,
    {HISTORY_ROW_COLUMNS}, ep_rank);
"""

MIGRATIONS: tuple[str, ...] = (SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4)
SCHEMA_VERSION = len(MIGRATIONS)

# Each batch is written with a few statements of many rows each: the sqlite3 module releases the
# GIL around every statement step, and with the HTTP loop busy, taking it back costs far more than
# the step itself (per-row statements made the writer wait ~5x longer than it worked).
REPORT_KEY_COLUMNS = ("cluster", "role", "ep_rank", "boot_id", "sequence")
REPORT_COLUMNS = (*REPORT_KEY_COLUMNS, "received_unix_s", "interval_end_unix_s", "peak_runtime_tokens", "cap",
                  "forward_steps", "overflow_events", "payload", "max_local_tokens")
# A window row: its key, then the window rule's fields (advisor/sample.py) in their order.
WINDOW_COLUMNS = ("cluster", "role", "window_start_s", *(rule.name for rule in WINDOW_FIELDS))


def _values(columns: int, rows: int) -> str:
    row = "(" + ", ".join("?" * columns) + ")"
    return ", ".join([row] * rows)


@functools.lru_cache(maxsize=1024)
def existing_reports_sql(rows: int) -> str:
    """The keys among ``rows`` given keys that are already stored (looked up by the UNIQUE index)."""
    columns = ", ".join(REPORT_KEY_COLUMNS)
    return (f"WITH batch ({columns}) AS (VALUES {_values(len(REPORT_KEY_COLUMNS), rows)}) "
            f"SELECT {', '.join('batch.' + name for name in REPORT_KEY_COLUMNS)} FROM batch "
            f"JOIN reports USING ({columns})")


@functools.lru_cache(maxsize=1024)
def insert_reports_sql(rows: int) -> str:
    return f"INSERT INTO reports ({', '.join(REPORT_COLUMNS)}) VALUES {_values(len(REPORT_COLUMNS), rows)}"


# The window rule's combinations in SQL: a row hitting a stored window combines with it field by field.
_COMBINED_SQL: dict[Combine, str] = {
    "max": "max({column}, excluded.{column})",
    "sum": f"min({{column}} + excluded.{{column}}, {SUM_LIMIT})",  # each row adds less than 2^58: no int64 overflow
}


@functools.lru_cache(maxsize=1024)
def upsert_windows_sql(rows: int) -> str:
    """Add ``rows`` window rows (WINDOW_COLUMNS, then 1 for the report count) by the window rule:
    a window's sample only grows. Rows hitting the same window apply one after another, as separate
    statements would."""
    combined = ", ".join(f"{rule.name} = " + _COMBINED_SQL[rule.combine].format(column=rule.name)
                         for rule in WINDOW_FIELDS)
    return (f"INSERT INTO windows ({', '.join(WINDOW_COLUMNS)}, reports) "
            f"VALUES {_values(len(WINDOW_COLUMNS) + 1, rows)} "
            f"ON CONFLICT (cluster, role, window_start_s) DO UPDATE SET {combined}, "
            f"reports = min(reports + excluded.reports, {SUM_LIMIT})")
