-- The append-only audit log (src/audit): one row per event of an execution, each
-- chained to the previous row by SHA-256. Arguments are stored redacted.
CREATE TABLE audit (
    id            BIGINT PRIMARY KEY,  -- 1, 2, 3, ... without gaps
    at_ms         BIGINT NOT NULL,     -- ms since the Unix epoch
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
    duration_ms   BIGINT,
    prev_hash     BYTEA NOT NULL,        -- the previous row's hash; 32 zero bytes for the first
    hash          BYTEA NOT NULL         -- SHA-256(prev_hash || canonical row)
);

CREATE INDEX audit_by_execution ON audit (execution_id);
CREATE INDEX audit_by_thread ON audit (thread_id);

CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only';
END;
$$;

CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();

CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
