-- Thread events (Plain's `createThreadEvent`) waiting to reach Plain: a held call's
-- trail (held, decided, ran). Each has its own external id, which Plain refuses to take
-- twice, so a re-sent event never shows twice. `seq` keeps a thread's events in order.
CREATE TABLE thread_event_outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    external_id     TEXT NOT NULL UNIQUE,
    thread_id       TEXT NOT NULL,
    title           TEXT NOT NULL,
    body            TEXT NOT NULL,
    link_url        TEXT,
    link_label      TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms INTEGER NOT NULL,
    sent_at_ms      INTEGER,
    last_error      TEXT
);
CREATE INDEX thread_event_outbox_due ON thread_event_outbox (thread_id, seq)
    WHERE sent_at_ms IS NULL;

-- The state labels each thread should carry in Plain (`[plain] labels`): whether its
-- session runs and whether it was handed to a person are kept here; whether a call
-- waits for a person is read from `executions` when the labels are synced. A thread
-- whose `version` is past its `synced_version` is synced by the outbox.
CREATE TABLE thread_label_state (
    thread_id        TEXT PRIMARY KEY,
    agent_working    INTEGER NOT NULL DEFAULT 0,
    handed_to_person INTEGER NOT NULL DEFAULT 0,
    version          INTEGER NOT NULL DEFAULT 1,
    synced_version   INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms  INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT
);
