-- Failed sign-ins and failed credentials (src/reviewers/throttle.rs), counted here so
-- every instance sharing this database throttles the same key: a flood split across
-- instances is refused as on one. A key is the SHA-256 of the throttle's namespace and
-- its key (a name from an address, an address, a name), never the typed name itself.
-- Rows past their expiry are pruned before a new key is tracked; the live rows are
-- capped (a full table refuses new keys until rows expire).
CREATE TABLE auth_failures (
    key_digest      TEXT PRIMARY KEY,  -- hex SHA-256 of "<namespace>|<key>"
    failures        INTEGER NOT NULL,  -- within the window that began at first_ms
    first_ms        INTEGER NOT NULL,  -- when the window began
    locked_until_ms INTEGER NOT NULL,  -- refused until then (0: not refused)
    expires_at_ms   INTEGER NOT NULL   -- max(first_ms + window, locked_until_ms): dead after
) STRICT;
CREATE INDEX auth_failures_by_expiry ON auth_failures (expires_at_ms);
