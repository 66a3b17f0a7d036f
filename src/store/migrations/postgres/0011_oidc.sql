-- Reviewer sign-in through the team's OpenID provider (src/review/oidc).
-- A reviewer made by a provider's sign-in keeps the provider's subject ("<issuer> <sub>"),
-- so the same person finds the same reviewer, and no one else can take its name.
ALTER TABLE reviewers ADD COLUMN oidc_subject TEXT;
CREATE UNIQUE INDEX reviewers_by_oidc_subject ON reviewers (oidc_subject);

-- Sign-ins sent to the provider and not yet back: one use each, bound to the browser
-- that started them, expiring. Secrets are stored as SHA-256 digests where a digest
-- suffices (the state, the browser's cookie).
CREATE TABLE oidc_logins (
    state_digest   TEXT PRIMARY KEY,  -- hex SHA-256 of the `state` sent to the provider
    browser_digest TEXT NOT NULL,     -- hex SHA-256 of the browser's tg_oidc cookie
    client         TEXT NOT NULL,     -- the client address's throttle key
    nonce          TEXT NOT NULL,
    pkce_verifier  TEXT NOT NULL,
    next           TEXT NOT NULL,     -- the page to return to
    created_at_ms  BIGINT NOT NULL
);
CREATE INDEX oidc_logins_by_client ON oidc_logins (client);
CREATE INDEX oidc_logins_by_age ON oidc_logins (created_at_ms);
