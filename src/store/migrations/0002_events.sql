-- Every accepted Plain webhook delivery, once per Plain event id (retries are dropped).
-- `seq` orders events as received; sessions apply a thread's events in `occurred_at_ms`
-- order. `applied_at_ms` is set by the orchestrator once it has acted on the event.
CREATE TABLE events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id       TEXT NOT NULL UNIQUE,
    event_type     TEXT NOT NULL,
    class          TEXT NOT NULL,   -- 'customer' | 'done' | 'info' | 'ignored'
    thread_id      TEXT,
    thread_status  TEXT,
    customer_id    TEXT,
    customer_email TEXT,
    actor          TEXT NOT NULL,   -- 'customer' | 'user' | 'machine_user' | 'system' | 'unknown'
    occurred_at_ms INTEGER NOT NULL,
    received_at_ms INTEGER NOT NULL,
    body           TEXT NOT NULL,
    applied_at_ms  INTEGER
);

-- A thread's events in the order they happened.
CREATE INDEX events_by_thread ON events (thread_id, occurred_at_ms, seq);

-- Events a session still has to act on: small, since applied and ignored rows leave it.
CREATE INDEX events_unapplied ON events (thread_id, occurred_at_ms, seq)
    WHERE applied_at_ms IS NULL AND class <> 'ignored';
