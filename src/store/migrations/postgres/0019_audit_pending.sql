-- Audit rows written with the state change they record but not chained yet (src/audit):
-- on Postgres a write adds its rows here inside its own transaction, with no lock, and
-- right after its commit they are chained into `audit` under the chain's lock, together
-- with every row waiting then, oldest first, and taken out of here in that same
-- transaction. Empty but for the moment between a commit and its chaining (or, after a
-- crash in that moment, until the next chaining). `seq` orders the rows of one
-- transaction, and of transactions one of which committed before the other began.
CREATE TABLE audit_pending (
    seq           BIGSERIAL PRIMARY KEY,
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
