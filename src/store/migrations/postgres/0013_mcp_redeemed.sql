-- MCP request states already redeemed (src/mcp/state.rs), until they expire: single use
-- across every instance sharing this database. A state is known by the SHA-256 of its
-- random nonce; a session holds at most [mcp] max_redeemed_per_session of them.
CREATE TABLE mcp_redeemed_states (
    state_digest  TEXT PRIMARY KEY,   -- hex SHA-256 of the sealed state's nonce
    session_id    TEXT NOT NULL,      -- the session the state was sealed for
    expires_at_ms BIGINT NOT NULL     -- the state's own expiry; purged after it
);
CREATE INDEX mcp_redeemed_states_by_session ON mcp_redeemed_states (session_id, expires_at_ms);
CREATE INDEX mcp_redeemed_states_by_expiry ON mcp_redeemed_states (expires_at_ms);
