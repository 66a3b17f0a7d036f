//! The relay credential: what a pod's relay presents to reach its session's gateway
//! service, and nothing else.
//!
//! A credential is `tgr1.<session id>.<expiry, ms since the epoch>.<nonce>.<mac>`: an
//! HMAC-SHA256 over everything before the last dot, under a key derived from the master
//! key with HKDF-SHA256 ([`CREDENTIAL_INFO`]; other uses of the master key derive with
//! other labels, so no two uses share a key). It names exactly one session and carries
//! its own expiry, so:
//!
//! - it is useless for any other session: the session it reaches is the one it names,
//!   and changing the name (or the expiry) breaks the MAC;
//! - it is short-lived ([`RelayCredentials::ttl`], `[relay] credential_ttl`, 15 minutes by
//!   default) and renewed by the relay over a connection the credential itself opened
//!   (`POST /relay/v1/renew`, see `relay::control`), so it never needs to live long;
//! - it survives a restart of threadgate, and every replica sharing the master key
//!   verifies it, because nothing of it is kept in memory;
//! - a session that has stopped is refused by the listener (its service is gone), so a
//!   credential of a stopped session reaches nothing even before it expires.
//!
//! The MAC is checked, in constant time, before any other field is read. A credential
//! is a [`SecretString`]: never printed, never logged.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit as _, Mac as _};
use rand::Rng as _;
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::clock::Clock;
use crate::ids::SessionId;
use crate::secrets::{ExposeSecret as _, MasterKey, SecretString};

/// The HKDF `info` label of the credential key: this use of the master key only.
pub const CREDENTIAL_INFO: &[u8] = b"threadgate relay credential v1";
/// The version tag every credential starts with.
const PREFIX: &str = "tgr1";

/// Whether `text` has the shape of a minted credential (and not of a pod's
/// service-account token): the listener picks the check by it.
pub fn is_minted(text: &str) -> bool {
    text.strip_prefix(PREFIX)
        .is_some_and(|rest| rest.starts_with('.'))
}
/// The longest credential accepted: a session id (128) and the fixed fields, with room.
pub const MAX_CREDENTIAL_LEN: usize = 320;
/// Random bytes of the nonce: two credentials minted in the same millisecond differ.
const NONCE_LEN: usize = 12;

type HmacSha256 = Hmac<Sha256>;

/// Why a credential was refused. Says nothing of the credential's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Not a credential, or its MAC does not match (tampered, or minted under another key).
    #[error("the relay credential is not valid")]
    Invalid,
    /// Well formed and authentic, but past its expiry.
    #[error("the relay credential has expired")]
    Expired,
}

/// A verified credential: the one session it reaches, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub session_id: SessionId,
    pub expires_at_ms: i64,
}

/// Mints and verifies relay credentials under the key derived from the master key.
pub struct RelayCredentials {
    key: Zeroizing<[u8; 32]>,
    ttl: Duration,
    clock: Clock,
}

impl std::fmt::Debug for RelayCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayCredentials")
            .field("key", &"[redacted]")
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl RelayCredentials {
    /// Credentials under `master`'s relay key, each valid for `ttl` from its minting by
    /// `clock`.
    pub fn new(master: &MasterKey, ttl: Duration, clock: Clock) -> RelayCredentials {
        let mut key = Zeroizing::new([0u8; 32]);
        let hkdf = hkdf::Hkdf::<Sha256>::new(None, master.bytes());
        // INVARIANT: 32 bytes is far below HKDF-SHA256's limit of 255 * 32.
        if hkdf.expand(CREDENTIAL_INFO, key.as_mut()).is_err() {
            unreachable_length();
        }
        RelayCredentials { key, ttl, clock }
    }

    /// How long a freshly minted credential is valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A credential for `session`, valid for [`RelayCredentials::ttl`] from now: what a
    /// backend hands its sandbox's relay at start (the Kubernetes backend writes it into
    /// the session's Secret).
    pub fn mint(&self, session: &SessionId) -> SecretString {
        let ttl_ms = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
        self.mint_expiring(session, self.clock.now_ms().saturating_add(ttl_ms))
    }

    /// A credential for `session` that expires at `expires_at_ms` (ms since the epoch).
    pub fn mint_expiring(&self, session: &SessionId, expires_at_ms: i64) -> SecretString {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let body = format!(
            "{PREFIX}.{session}.{expires_at_ms}.{}",
            URL_SAFE_NO_PAD.encode(nonce)
        );
        let tag = URL_SAFE_NO_PAD.encode(self.mac(&body).finalize().into_bytes());
        SecretString::from(format!("{body}.{tag}"))
    }

    /// The session `credential` reaches, if it is authentic and unexpired. The MAC is
    /// compared in constant time before any field is parsed.
    pub fn verify(&self, credential: &SecretString) -> Result<Verified, CredentialError> {
        let text = credential.expose_secret();
        if text.len() > MAX_CREDENTIAL_LEN {
            return Err(CredentialError::Invalid);
        }
        let (body, tag) = text.rsplit_once('.').ok_or(CredentialError::Invalid)?;
        let tag = Zeroizing::new(
            URL_SAFE_NO_PAD
                .decode(tag)
                .map_err(|_| CredentialError::Invalid)?,
        );
        self.mac(body)
            .verify_slice(&tag)
            .map_err(|_| CredentialError::Invalid)?;
        let mut fields = body.split('.');
        let (Some(PREFIX), Some(session), Some(expiry), Some(_nonce), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(CredentialError::Invalid);
        };
        let session_id = SessionId::parse(session).map_err(|_| CredentialError::Invalid)?;
        let expires_at_ms: i64 = expiry.parse().map_err(|_| CredentialError::Invalid)?;
        if self.clock.now_ms() >= expires_at_ms {
            return Err(CredentialError::Expired);
        }
        Ok(Verified {
            session_id,
            expires_at_ms,
        })
    }

    fn mac(&self, body: &str) -> HmacSha256 {
        let mut mac = match HmacSha256::new_from_slice(self.key.as_ref()) {
            Ok(mac) => mac,
            // INVARIANT: HMAC takes a key of any length.
            Err(_) => unreachable_length(),
        };
        mac.update(body.as_bytes());
        mac
    }
}

#[cold]
fn unreachable_length() -> ! {
    unreachable!("HKDF and HMAC accept these fixed lengths")
}

impl crate::sandbox::RelayMinter for RelayCredentials {
    fn mint(&self, session: &SessionId) -> SecretString {
        RelayCredentials::mint(self, session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(ms: i64) -> RelayCredentials {
        let key = MasterKey::from_base64(
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            crate::secrets::KeySource::Env("test".into()),
        )
        .expect("key");
        RelayCredentials::new(&key, Duration::from_secs(900), Clock::fixed(ms))
    }

    fn session(text: &str) -> SessionId {
        SessionId::parse(text).expect("session id")
    }

    #[test]
    fn a_minted_credential_reaches_its_session_until_it_expires() {
        let at = credentials(1_000_000);
        let token = at.mint(&session("s1"));
        let verified = at.verify(&token).expect("valid");
        assert_eq!(verified.session_id.as_str(), "s1");
        assert_eq!(verified.expires_at_ms, 1_000_000 + 900_000);
        // Just before and at the expiry.
        assert!(credentials(1_899_999).verify(&token).is_ok());
        assert_eq!(
            credentials(1_900_000).verify(&token),
            Err(CredentialError::Expired)
        );
        // Two credentials of one session differ (the nonce).
        assert_ne!(
            at.mint(&session("s1")).expose_secret(),
            token.expose_secret()
        );
    }

    #[test]
    fn a_changed_field_or_another_key_is_invalid() {
        let at = credentials(0);
        let token = at.mint(&session("sA")).expose_secret().to_owned();
        let tampered = [
            token.replacen(".sA.", ".sB.", 1),
            token.replacen("tgr1.", "tgr2.", 1),
            token.replacen(".900000.", ".900001.", 1),
            format!("{token}A"),
            token.get(..token.len() - 1).unwrap_or_default().to_owned(),
            String::new(),
            "tgr1.sA.9999999999999.x".to_owned(),
            "x".repeat(MAX_CREDENTIAL_LEN + 1),
        ];
        for bad in tampered {
            assert_eq!(
                at.verify(&SecretString::from(bad.clone())),
                Err(CredentialError::Invalid),
                "{bad}"
            );
        }
        let other = MasterKey::generate();
        let elsewhere = RelayCredentials::new(&other, Duration::from_secs(900), Clock::fixed(0));
        assert_eq!(
            elsewhere.verify(&SecretString::from(token)),
            Err(CredentialError::Invalid)
        );
    }

    #[test]
    fn the_debug_output_shows_no_key() {
        let text = format!("{:?}", credentials(0));
        assert!(text.contains("[redacted]"), "{text}");
    }
}
