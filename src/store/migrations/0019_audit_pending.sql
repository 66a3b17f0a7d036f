-- Audit rows written with the state change they record but not chained yet (src/audit).
-- Used on Postgres only, where writers run at once and chain their rows right after
-- their commit; SQLite's single writer chains each row as it is written, so this table
-- stays empty here. Kept for the same schema in both dialects.
CREATE TABLE audit_pending (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    xact          INTEGER NOT NULL DEFAULT 0,
    at_ms         INTEGER NOT NULL,
    execution_id  TEXT,
    event         TEXT NOT NULL,
    session_id    TEXT,
    thread_id     TEXT,
    agent         TEXT,
    tool          TEXT,
    args_redacted TEXT,
    decision      TEXT,
    rule          TEXT,
    policy_hash   TEXT,
    reviewer      TEXT,
    outcome       TEXT,
    duration_ms   INTEGER
);
