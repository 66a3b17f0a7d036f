-- The append-only audit log (src/audit): one row per event of an execution, each
-- chained to the previous row by SHA-256. Arguments are stored redacted.
CREATE TABLE audit (
    id            INTEGER PRIMARY KEY,  -- 1, 2, 3, ... without gaps
    at_ms         INTEGER NOT NULL,     -- ms since the Unix epoch
    execution_id  TEXT,
    event         TEXT NOT NULL,        -- requested, decided, held, ran, ...
    session_id    TEXT,
    thread_id     TEXT,
    agent         TEXT,
    tool          TEXT,
    args_redacted TEXT,                 -- JSON
    decision      TEXT,
    rule          TEXT,
    policy_hash   TEXT,
    reviewer      TEXT,
    outcome       TEXT,
    duration_ms   INTEGER,
    prev_hash     BLOB NOT NULL,        -- the previous row's hash; 32 zero bytes for the first
    hash          BLOB NOT NULL         -- SHA-256(prev_hash || canonical row)
) STRICT;

CREATE INDEX audit_by_execution ON audit (execution_id);
CREATE INDEX audit_by_thread ON audit (thread_id);

CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;

CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
