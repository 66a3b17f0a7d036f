-- Secrets encrypted at rest under the master key (see src/secrets/cipher.rs), and the
-- agents each one is granted to. Values never appear here in clear.
CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    scheme     INTEGER NOT NULL,   -- 1 = XChaCha20-Poly1305, AAD = prefix || name
    nonce      BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    created_at INTEGER NOT NULL,   -- ms since the Unix epoch
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE secret_grants (
    secret     TEXT NOT NULL REFERENCES secrets (name) ON DELETE CASCADE,
    agent      TEXT NOT NULL,
    granted_at INTEGER NOT NULL,
    PRIMARY KEY (secret, agent)
) STRICT;

CREATE INDEX secret_grants_by_agent ON secret_grants (agent);
