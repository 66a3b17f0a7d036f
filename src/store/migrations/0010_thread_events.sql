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
