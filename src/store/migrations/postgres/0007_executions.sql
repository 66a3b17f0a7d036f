-- Every tool call a session made: what was asked, what the gate decided, and what
-- happened. A held call's row is its frozen request: `args` and `binding_hash` never
-- change after insert.
CREATE TABLE executions (
    id               TEXT PRIMARY KEY,
    session_id       TEXT NOT NULL,
    thread_id        TEXT NOT NULL,
    agent            TEXT NOT NULL,
    tool             TEXT NOT NULL,
    args             TEXT NOT NULL,
    account          TEXT NOT NULL,
    binding_hash     TEXT NOT NULL,
    diagnosis        TEXT,
    verdict          TEXT NOT NULL CHECK (verdict IN ('run', 'hold', 'block')),
    because          TEXT NOT NULL,
    rule_line        BIGINT,
    policy_hash      TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed',
                         'needs_check', 'held', 'approved', 'denied', 'expired', 'blocked')),
    summary          TEXT,
    expires_at_ms    BIGINT,
    reviewer         TEXT,
    decision_message TEXT,
    decided_at_ms    BIGINT,
    result           TEXT,
    error            TEXT,
    attempts         BIGINT NOT NULL DEFAULT 0,
    created_at_ms    BIGINT NOT NULL,
    finished_at_ms   BIGINT
);
CREATE INDEX executions_by_binding ON executions (session_id, binding_hash, status);
CREATE INDEX executions_by_tool ON executions (session_id, tool, status);
CREATE INDEX executions_by_status ON executions (status, expires_at_ms);

-- Amounts counted against cumulative limits: written in the same transaction that
-- decides the call, released when the provider definitely refused it.
CREATE TABLE limit_charges (
    execution_id TEXT NOT NULL REFERENCES executions (id),
    key          TEXT NOT NULL,
    amount       BIGINT NOT NULL,
    at_ms        BIGINT NOT NULL,
    released     BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX limit_charges_by_key ON limit_charges (key, at_ms);

-- Internal notes waiting to reach Plain. A row is removed from the queue (sent_at_ms
-- set) only once Plain has the note.
CREATE TABLE note_outbox (
    execution_id    TEXT PRIMARY KEY REFERENCES executions (id),
    thread_id       TEXT NOT NULL,
    marker          TEXT NOT NULL,
    text            TEXT NOT NULL,
    markdown        TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_ms BIGINT NOT NULL,
    sent_at_ms      BIGINT,
    last_error      TEXT
);
CREATE INDEX note_outbox_due ON note_outbox (next_attempt_ms) WHERE sent_at_ms IS NULL;
