-- A started OpenID sign-in is no longer a row: its state, nonce, PKCE verifier, return
-- page and expiry travel sealed in the browser's tg_oidc cookie (src/review/oidc/sealed.rs),
-- so any instance sharing the master key finishes it and a flood of starts fills nothing.
-- Sign-ins started before this migration and not yet back are refused; they sign in again.
DROP TABLE oidc_logins;
