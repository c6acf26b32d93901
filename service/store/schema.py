"""SQLite schema. Raw reports are kept for the retention window; per-window group samples for
the fold window; older samples live only in one bounded decaying histogram per cluster/role."""

SCHEMA = """
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
"""

# A window's sample only grows: the hottest rank's peak, the largest cap, every overflow.
UPSERT_WINDOW = """
INSERT INTO windows (cluster, role, window_start_s, peak_runtime_tokens, cap, overflow_events, reports)
VALUES (?, ?, ?, ?, ?, ?, 1)
ON CONFLICT (cluster, role, window_start_s) DO UPDATE SET
    peak_runtime_tokens = max(peak_runtime_tokens, excluded.peak_runtime_tokens),
    cap = max(cap, excluded.cap),
    overflow_events = overflow_events + excluded.overflow_events,
    reports = reports + 1
"""
