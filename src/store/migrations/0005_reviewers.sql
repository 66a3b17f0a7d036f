-- People who may approve or deny held calls (src/approvals/reviewers.rs). The credential
-- is stored only as an argon2id PHC hash.
CREATE TABLE reviewers (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so old tokens stay dead
    name       TEXT NOT NULL UNIQUE,
    token_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL                    -- ms since the Unix epoch
) STRICT;
