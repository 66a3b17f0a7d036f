-- Secrets encrypted at rest under the master key (see src/secrets/cipher.rs), and the
-- agents each one is granted to. Values never appear here in clear.
CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    scheme     BIGINT NOT NULL,   -- 1 = XChaCha20-Poly1305, AAD = prefix || name
    nonce      BYTEA NOT NULL,
    ciphertext BYTEA NOT NULL,
    created_at BIGINT NOT NULL,   -- ms since the Unix epoch
    updated_at BIGINT NOT NULL
);

CREATE TABLE secret_grants (
    secret     TEXT NOT NULL REFERENCES secrets (name) ON DELETE CASCADE,
    agent      TEXT NOT NULL,
    granted_at BIGINT NOT NULL,
    PRIMARY KEY (secret, agent)
);

CREATE INDEX secret_grants_by_agent ON secret_grants (agent);
