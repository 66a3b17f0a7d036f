-- Several instances on one database (issue 19).
--
-- Every running threadgate registers here under its instance id with a nonce of its
-- boot; it renews `heartbeat_at_ms` while it lives. A second process that starts with
-- an instance id whose heartbeat is fresher than the lease time and whose nonce is not
-- its own is refused: two instances with the same id would reap each other's
-- containers.
CREATE TABLE instances (
    instance_id     TEXT PRIMARY KEY,
    boot_nonce      TEXT NOT NULL,
    started_at_ms   BIGINT NOT NULL,
    heartbeat_at_ms BIGINT NOT NULL
);

-- Who runs a thread's live session: one row per thread that ever had an owner. `token`
-- is the fencing token: it grows by one at every acquisition (never reset: a released
-- lease keeps its row, expired), and every write the owner makes for the session
-- carries it, so the database refuses a stale owner's write. A lease whose
-- `expires_at_ms` has passed may be taken by any instance.
CREATE TABLE session_leases (
    thread_id     TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    token         BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX session_leases_by_owner ON session_leases (owner);
