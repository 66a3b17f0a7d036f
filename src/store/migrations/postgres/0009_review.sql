-- The review page (src/review): reviewers' sign-in passwords (argon2id PHC hashes) and
-- their signed-in sessions. A session cookie is stored only as its SHA-256 digest.
ALTER TABLE reviewers ADD COLUMN password_hash TEXT;

CREATE TABLE review_sessions (
    token_digest  TEXT PRIMARY KEY,       -- hex SHA-256 of the cookie's value
    reviewer_id   BIGINT NOT NULL,
    csrf          TEXT NOT NULL,          -- the token every form of this session carries
    created_at_ms BIGINT NOT NULL,
    last_seen_ms  BIGINT NOT NULL
);
CREATE INDEX review_sessions_by_reviewer ON review_sessions (reviewer_id);
