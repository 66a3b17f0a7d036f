//! Plain's request signature: the lowercase hex HMAC-SHA256 of the raw body bytes,
//! keyed with the workspace's signing secret, sent in `Plain-Request-Signature`.

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The header Plain puts the signature in.
pub const SIGNATURE_HEADER: &str = "Plain-Request-Signature";

/// The workspace's request-signing secret: never empty, and (through `secrecy`) never
/// printed (`Debug` shows `[REDACTED]`, there is no `Display`) and wiped on drop.
#[derive(Clone, Debug)]
pub struct SigningSecret(SecretSlice<u8>);

/// Why a signing secret was refused.
#[derive(Debug, thiserror::Error)]
pub enum SigningSecretError {
    /// An empty secret would make every signature forgeable.
    #[error("the webhook signing secret is empty")]
    Empty,
}

impl SigningSecret {
    /// Wraps the secret as configured (the bytes Plain shows under request signing).
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<SigningSecret, SigningSecretError> {
        let secret = SecretSlice::from(secret.into());
        if secret.expose_secret().is_empty() {
            return Err(SigningSecretError::Empty);
        }
        Ok(SigningSecret(secret))
    }
}

impl ExposeSecret<[u8]> for SigningSecret {
    /// The secret's bytes, for computing a signature.
    fn expose_secret(&self) -> &[u8] {
        self.0.expose_secret()
    }
}

/// Why a delivery's signature was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Plain-Request-Signature` header.
    #[error("missing Plain-Request-Signature header")]
    Missing,
    /// The header is not 64 hex digits.
    #[error("malformed Plain-Request-Signature header: expected 64 hex digits")]
    Malformed,
    /// The header is well formed but is not the body's signature under our secret.
    #[error("Plain-Request-Signature does not match the body")]
    Mismatch,
}

/// Checks `header` against the HMAC-SHA256 of `body` under `secret`, in constant time.
///
/// `header` is the raw `Plain-Request-Signature` value (`None` when absent). Plain sends
/// lowercase hex; hex digits in either case are accepted since they encode the same tag.
pub fn verify_signature(
    secret: &[u8],
    body: &[u8],
    header: Option<&str>,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut tag = [0u8; 32];
    hex::decode_to_slice(header.as_bytes(), &mut tag).map_err(|_| SignatureError::Malformed)?;
    mac(secret, body)
        .verify_slice(&tag)
        .map_err(|_| SignatureError::Mismatch)
}

/// The `Plain-Request-Signature` value for `body` under `secret` (lowercase hex), as
/// Plain computes it. For tests, benchmarks and local tools that send deliveries.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    hex::encode(mac(secret, body).finalize().into_bytes())
}

fn mac(secret: &[u8], body: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length (a long key is hashed first): `new_from_slice`
    // never fails for it, so this `expect` cannot fire.
    #[expect(clippy::expect_used, reason = "HMAC accepts keys of any length")]
    let mut mac = HmacSha256::new_from_slice(secret).expect("hmac accepts keys of any length");
    mac.update(body);
    mac
}
