//! A started sign-in, kept by the browser that started it: its `state`, nonce, PKCE
//! verifier, return page and expiry sealed (XChaCha20-Poly1305) into the `tg_oidc`
//! cookie under a key derived from the master key
//! ([`crate::secrets::SealPurpose::OidcSignIn`]). The server keeps nothing: any
//! instance with the same master key finishes a sign-in another started, and a flood
//! of started sign-ins costs the server no row and no memory, so it needs no cap (the
//! per-address cap it replaces locked everyone behind one reverse proxy out).
//!
//! The callback opens the cookie, checks the provider's `state` parameter against the
//! sealed one (constant time) and the expiry ([`TTL_MS`]); the nonce then binds the ID
//! token and the verifier the code exchange, as before.
//!
//! Replay. A sealed cookie stays openable until its expiry, and the server keeps no
//! record of its use, on purpose:
//! - the authorization code is single use at the provider (and bound to the PKCE
//!   challenge whose verifier is in the cookie), so the callback URL replayed, with or
//!   without the cookie, exchanges nothing;
//! - a new code for the same cookie must come from an authorization request carrying
//!   its `state`, nonce and challenge, completed at the provider by whoever signs in
//!   there: the ID token names that person (the nonce binds it to this cookie), so a
//!   replay signs in no one but the person who signed in at the provider;
//! - the cookie is HttpOnly, Secure on an https public URL, SameSite=Lax and sent only
//!   to the callback path; a page on another site can neither read nor set it, so it
//!   cannot plant its own started sign-in in a victim's browser (login CSRF needs the
//!   victim's cookie and the provider's answer to its `state`).
//!
//! A used-set in the database would add nothing these do not give, and would be one
//! more thing a flood fills: anyone can start and finish (with a made-up code) as many
//! sign-ins as they like.

use std::fmt;

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;

use crate::secrets::SealingKey;

/// A sign-in must come back from the provider within this long.
pub const TTL_MS: i64 = 10 * 60 * 1000;
/// Domain separation of the associated data.
const AAD: &[u8] = b"threadgate oidc sign-in cookie v1\0";
/// The longest cookie opened (a real one is about 600 characters: the return page is
/// at most 256 bytes).
const MAX_COOKIE_LEN: usize = 2048;

/// A sign-in sent to the provider, as sealed in the cookie.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignIn {
    /// The `state` sent to the provider.
    pub state: String,
    /// The nonce the ID token must carry.
    pub nonce: String,
    /// The PKCE verifier of the challenge sent to the provider.
    pub pkce_verifier: String,
    /// Where to go once signed in.
    pub next: String,
    /// Unix ms after which the sign-in is void.
    pub expires_at_ms: i64,
}

impl fmt::Debug for SignIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The state, nonce and verifier are one sign-in's secrets.
        f.debug_struct("SignIn")
            .field("next", &self.next)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// Why a returning sign-in was not accepted; each says what to do (sign in again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "this browser has no sign-in in progress here (it was started elsewhere, or cookies are off)"
    )]
    NoCookie,
    #[error("this browser's sign-in cookie is not one this site issued")]
    Unreadable,
    #[error(
        "this sign-in was started in another browser, or the identity provider answered another one"
    )]
    StateMismatch,
    #[error("this sign-in took longer than ten minutes")]
    Expired,
}

/// Seals started sign-ins into cookies and opens them again.
pub struct CookieSealer {
    key: SealingKey,
}

impl CookieSealer {
    /// A sealer under `key` (derived with [`crate::secrets::SealPurpose::OidcSignIn`]).
    pub fn new(key: SealingKey) -> CookieSealer {
        CookieSealer { key }
    }

    /// The cookie value of `sign_in`.
    pub fn seal(&self, sign_in: &SignIn) -> String {
        // Serialising a struct of strings and an integer cannot fail.
        let plain = serde_json::to_vec(sign_in).unwrap_or_default();
        self.key.seal(AAD, &plain)
    }

    /// The sign-in sealed in `cookie`, if this site sealed it (under the same master
    /// key), the provider's `state` is its own and it has not expired at `now_ms`.
    pub fn open(&self, cookie: Option<&str>, state: &str, now_ms: i64) -> Result<SignIn, Refused> {
        let cookie = cookie.filter(|c| !c.is_empty()).ok_or(Refused::NoCookie)?;
        let plain = self
            .key
            .open(AAD, cookie, MAX_COOKIE_LEN)
            .ok_or(Refused::Unreadable)?;
        let sign_in: SignIn = serde_json::from_slice(&plain).map_err(|_| Refused::Unreadable)?;
        if !bool::from(sign_in.state.as_bytes().ct_eq(state.as_bytes())) {
            return Err(Refused::StateMismatch);
        }
        if now_ms >= sign_in.expires_at_ms {
            return Err(Refused::Expired);
        }
        Ok(sign_in)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn sign_in(state: &str, expires_at_ms: i64) -> SignIn {
        SignIn {
            state: state.into(),
            nonce: "nonce-1".into(),
            pkce_verifier: "verifier-1".into(),
            next: format!("/approvals/{}", "x".repeat(240)),
            expires_at_ms,
        }
    }

    #[test]
    fn a_sealed_sign_in_opens_for_its_state_before_it_expires() {
        let sealer = CookieSealer::new(SealingKey::random());
        let started = sign_in("state-1", 1_000 + TTL_MS);
        let cookie = sealer.seal(&started);
        assert!(cookie.len() < MAX_COOKIE_LEN, "{}", cookie.len());
        assert!(!cookie.contains("verifier"), "sealed, not readable");
        assert_eq!(sealer.open(Some(&cookie), "state-1", 1_000), Ok(started));
        // Not used up: the provider's single-use code is what stops a replay.
        assert!(sealer.open(Some(&cookie), "state-1", 2_000).is_ok());
    }

    #[test]
    fn every_wrong_cookie_is_refused_with_its_reason() {
        let sealer = CookieSealer::new(SealingKey::random());
        let cookie = sealer.seal(&sign_in("state-1", 1_000 + TTL_MS));
        let check = |cookie: Option<&str>, state: &str, now: i64| sealer.open(cookie, state, now);
        assert_eq!(check(None, "state-1", 1_000), Err(Refused::NoCookie));
        assert_eq!(check(Some(""), "state-1", 1_000), Err(Refused::NoCookie));
        assert_eq!(
            check(Some(&cookie), "state-2", 1_000),
            Err(Refused::StateMismatch)
        );
        assert_eq!(
            check(Some(&cookie), "state-1", 1_000 + TTL_MS),
            Err(Refused::Expired)
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&cookie).expect("b64");
        if let Some(b) = bytes.get_mut(30) {
            *b ^= 1;
        }
        let tampered = URL_SAFE_NO_PAD.encode(bytes);
        let foreign = CookieSealer::new(SealingKey::random()).seal(&sign_in("state-1", i64::MAX));
        for bad in [
            tampered.as_str(),
            foreign.as_str(),
            "junk",
            &"A".repeat(4096),
        ] {
            assert_eq!(check(Some(bad), "state-1", 1_000), Err(Refused::Unreadable));
        }
        let debug = format!("{:?}", sign_in("state-secret", 0));
        assert!(
            !debug.contains("state-secret") && !debug.contains("verifier"),
            "{debug}"
        );
    }
}
