-- One row per support thread that ever had a session.
CREATE TABLE sessions (
    thread_id       TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL UNIQUE,
    agent           TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('queued', 'starting', 'running', 'idle', 'ended')),
    container_id    TEXT,
    branch          TEXT NOT NULL,
    worktree        TEXT,
    customer_id     TEXT,
    customer_email  TEXT,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    last_event_ms   BIGINT NOT NULL DEFAULT 0,
    attempts        BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT,
    stop_requested  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX sessions_by_state ON sessions (state, updated_at_ms);

-- The position of an applied event in its thread's feed (what the agent reads).
ALTER TABLE events ADD COLUMN thread_pos BIGINT;
CREATE UNIQUE INDEX events_feed ON events (thread_id, thread_pos) WHERE thread_pos IS NOT NULL;
