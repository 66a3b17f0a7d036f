-- Audit rows written with the state change they record but not chained yet (src/audit):
-- on Postgres a write adds its rows here inside its own transaction, with no lock, and
-- right after its commit they are chained into `audit` under the chain's lock, together
-- with every row waiting then, oldest first, and taken out of here in that same
-- transaction. Empty but for the moment between a commit and its chaining (or, after a
-- crash in that moment, until the next chaining). Rows are chained in (xact, seq)
-- order: a transaction's rows together, in the order it wrote them, and a transaction
-- that began after another committed after it (its id was given out later).
CREATE TABLE audit_pending (
    seq           BIGSERIAL PRIMARY KEY,
    xact          BIGINT NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    at_ms         BIGINT NOT NULL,
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
    duration_ms   BIGINT
);
