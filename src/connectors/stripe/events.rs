//! Stripe's webhook events, `POST /webhooks/stripe` on the people's listener: they keep
//! the connector's remembered customer emails true.
//!
//! Stripe signs each delivery in `Stripe-Signature: t=TIMESTAMP,v1=HEX[,v1=HEX...]`: the
//! lowercase hex HMAC-SHA256 of `TIMESTAMP.BODY` keyed with the endpoint's signing secret
//! (`whsec_...`, stored as a secret and named by `[stripe] webhook_secret`). A delivery is
//! accepted when one `v1` matches and the timestamp is within five minutes of now.
//! `customer.updated` and `customer.deleted` forget that customer's remembered email
//! ([`super::StripeConnector::forget_customer`]); every other verified event is
//! acknowledged and ignored. Forgetting is idempotent, so a replay within the window does
//! nothing harmful.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use secrecy::ExposeSecret;
use serde_json::Value;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq as _};

use super::StripeConnector;
use crate::api_error::ApiError;
use crate::connectors::Credential;

/// The header Stripe signs its deliveries in.
pub const SIGNATURE_HEADER: &str = "Stripe-Signature";
/// How far a delivery's timestamp may be from now (Stripe's libraries' default).
pub const TOLERANCE: Duration = Duration::from_secs(300);
/// The largest event body read.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The limits on a `Stripe-Signature` header, checked before any MAC is computed
/// (`[stripe] webhook_max_signature_bytes` and `webhook_max_signature_entries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignatureLimits {
    /// The longest header read, in bytes.
    pub max_bytes: usize,
    /// The most comma-separated entries (`t=`, `v1=`, `v0=`, ...) in it.
    pub max_entries: usize,
}

impl Default for SignatureLimits {
    /// Room for a timestamp and a few signatures (Stripe sends two `v1` while a secret
    /// is being rolled), far below what would cost anything to parse.
    fn default() -> Self {
        SignatureLimits {
            max_bytes: 1024,
            max_entries: 8,
        }
    }
}

/// Why a delivery's signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Stripe-Signature` header.
    #[error("missing Stripe-Signature header")]
    Missing,
    /// The header has no `t=` timestamp or no `v1=` signature.
    #[error("malformed Stripe-Signature header: expected t=TIMESTAMP and v1=HEX")]
    Malformed,
    /// The header is longer than the configured limit.
    #[error(
        "malformed Stripe-Signature header: {bytes} bytes exceeds [stripe] \
         webhook_max_signature_bytes ({max})"
    )]
    TooLong {
        /// The header's length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The header has more entries than the configured limit.
    #[error(
        "malformed Stripe-Signature header: more entries than [stripe] \
         webhook_max_signature_entries ({max})"
    )]
    TooManyEntries {
        /// The limit.
        max: usize,
    },
    /// A `v1` entry is not a SHA-256 MAC in hex.
    #[error("malformed Stripe-Signature header: a v1 entry is not 64 hex digits")]
    NotASignature,
    /// The timestamp is too far from now.
    #[error("Stripe-Signature timestamp is {skew_s} s from now, beyond the {max_s} s window")]
    Stale {
        /// How far it is, in seconds.
        skew_s: i64,
        /// The window, in seconds.
        max_s: u64,
    },
    /// No `v1` signature matches the body under the configured secret.
    #[error("no v1 signature in Stripe-Signature matches the body")]
    Mismatch,
}

/// A SHA-256 MAC: what a `v1` entry holds, and what the body's MAC is compared with.
type Signature = [u8; 32];

/// A `Stripe-Signature` header read within its limits: the timestamp and the `v1`
/// signatures (at most [`SignatureLimits::max_entries`]).
#[derive(Debug, PartialEq, Eq)]
pub struct SignatureHeader {
    /// The signed timestamp, in seconds since the epoch.
    pub timestamp: i64,
    /// The `v1` entries, decoded.
    signatures: Vec<Signature>,
}

impl SignatureHeader {
    /// Reads `header` within `limits`. Nothing here depends on the body or the secret:
    /// a header that breaks a limit is refused before any MAC is computed.
    pub fn parse(header: &str, limits: SignatureLimits) -> Result<Self, SignatureError> {
        if header.len() > limits.max_bytes {
            return Err(SignatureError::TooLong {
                bytes: header.len(),
                max: limits.max_bytes,
            });
        }
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for (index, part) in header.split(',').enumerate() {
            if index >= limits.max_entries {
                return Err(SignatureError::TooManyEntries {
                    max: limits.max_entries,
                });
            }
            match part.trim().split_once('=') {
                Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
                Some(("v1", hex_sig)) => signatures.push(decode_signature(hex_sig)?),
                _ => {}
            }
        }
        match timestamp {
            Some(timestamp) if !signatures.is_empty() => Ok(SignatureHeader {
                timestamp,
                signatures,
            }),
            _ => Err(SignatureError::Malformed),
        }
    }

    /// Whether any `v1` entry equals `expected`, compared in constant time (every entry
    /// is compared, whichever matches).
    fn matches(&self, expected: &Signature) -> bool {
        let any = self
            .signatures
            .iter()
            .fold(Choice::from(0), |any, signature| {
                any | signature.ct_eq(expected)
            });
        bool::from(any)
    }
}

/// A `v1` entry: exactly 64 hex digits.
fn decode_signature(hex_sig: &str) -> Result<Signature, SignatureError> {
    let mut signature = [0u8; 32];
    hex::decode_to_slice(hex_sig, &mut signature).map_err(|_| SignatureError::NotASignature)?;
    Ok(signature)
}

/// Checks `header` (the raw `Stripe-Signature` value) for `body` under `secret`, at
/// `now_s` (seconds since the epoch). The header is read within `limits` first; the
/// body's MAC is then computed once, whatever the number of `v1` entries, and compared
/// with each in constant time.
pub fn verify(
    header: Option<&str>,
    body: &[u8],
    secret: &[u8],
    now_s: i64,
    limits: SignatureLimits,
) -> Result<(), SignatureError> {
    let header = SignatureHeader::parse(header.ok_or(SignatureError::Missing)?, limits)?;
    let skew_s = now_s.saturating_sub(header.timestamp).saturating_abs();
    if skew_s.unsigned_abs() > TOLERANCE.as_secs() {
        return Err(SignatureError::Stale {
            skew_s,
            max_s: TOLERANCE.as_secs(),
        });
    }
    let expected = mac(secret, header.timestamp, body);
    if header.matches(&expected) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The signature Stripe would send for `body` at `timestamp` (for tests and tools that
/// play Stripe).
pub fn sign(body: &[u8], secret: &[u8], timestamp: i64) -> String {
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac(secret, timestamp, body))
    )
}

/// The HMAC-SHA256 of `TIMESTAMP.BODY` under `secret`, as Stripe computes it.
fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Signature {
    // HMAC takes a key of any length, so the constructor cannot fail.
    #[expect(clippy::expect_used, reason = "HMAC accepts keys of any length")]
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// What the endpoint needs.
#[derive(Clone)]
pub struct EventsState {
    /// The connector whose memory the events keep true.
    pub stripe: Arc<StripeConnector>,
    /// Where a change is recorded for the other instances ([`super::changes`]).
    pub db: crate::store::Db,
    /// How long a recorded change is kept: the emails' max age (`[stripe]
    /// email_max_age`); no memory keeps an email longer.
    pub keep: Duration,
    /// The endpoint's signing secret, read from the secrets store at each delivery.
    pub secret: Credential,
    /// Milliseconds since the epoch.
    pub clock: crate::clock::Clock,
    /// The limits on the `Stripe-Signature` header.
    pub limits: SignatureLimits,
}

/// `POST /webhooks/stripe`.
pub fn router(state: EventsState) -> Router {
    Router::new()
        .route("/webhooks/stripe", post(receive))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

fn refuse(status: StatusCode, code: &'static str, message: String) -> Response {
    tracing::warn!(status = status.as_u16(), reason = %message, "stripe event refused");
    ApiError::new(status, code, message).into_response()
}

async fn receive(
    State(state): State<EventsState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Ok(body) = body else {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body is unreadable or larger than {MAX_BODY_BYTES} bytes"),
        );
    };
    let secret = match state.secret.resolve().await {
        Ok(secret) => secret,
        Err(e) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_configured",
                format!("cannot check Stripe's signature: {e}"),
            );
        }
    };
    let header = headers
        .get(SIGNATURE_HEADER)
        .map(|v| v.to_str().unwrap_or_default());
    let now_s = state.clock.now_ms().div_euclid(1000);
    if let Err(e) = verify(
        header,
        &body,
        secret.expose_secret().as_bytes(),
        now_s,
        state.limits,
    ) {
        let code = match e {
            SignatureError::Stale { .. } => "stale",
            _ => "bad_signature",
        };
        return refuse(StatusCode::BAD_REQUEST, code, e.to_string());
    }
    let event: Value = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                format!("the body is not a JSON event: {e}"),
            );
        }
    };
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let id = event.get("id").and_then(Value::as_str).unwrap_or_default();
    if matches!(kind, "customer.updated" | "customer.deleted") {
        let Some(customer) = event.pointer("/data/object/id").and_then(Value::as_str) else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                format!("{kind} event {id} has no data.object.id"),
            );
        };
        state.stripe.forget_customer(customer);
        // Every other instance forgets it at its next call: the change is recorded
        // before Stripe is answered, and a failure makes Stripe deliver it again.
        let (changed, now) = (customer.to_owned(), state.clock.now_ms());
        let keep = crate::clock::ms(state.keep);
        if let Err(e) = state
            .db
            .write(move |c| super::changes::record(c, &changed, now, keep))
            .await
        {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("cannot record that customer {customer} changed: {e}"),
            );
        }
        tracing::info!(
            event_id = id,
            kind,
            customer,
            "stripe customer changed: forgotten"
        );
    } else {
        tracing::debug!(event_id = id, kind, "stripe event ignored");
    }
    StatusCode::OK.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec_test_secret";
    const BODY: &[u8] = br#"{"id":"evt_1","type":"customer.updated"}"#;
    const LIMITS: SignatureLimits = SignatureLimits {
        max_bytes: 1024,
        max_entries: 8,
    };

    fn check(
        header: Option<&str>,
        body: &[u8],
        secret: &[u8],
        now_s: i64,
    ) -> Result<(), SignatureError> {
        verify(header, body, secret, now_s, LIMITS)
    }

    #[test]
    fn a_signature_made_by_sign_verifies() {
        let header = sign(BODY, SECRET, 1_700_000_000);
        assert_eq!(check(Some(&header), BODY, SECRET, 1_700_000_010), Ok(()));
    }

    #[test]
    fn one_matching_v1_among_several_is_enough() {
        let good = sign(BODY, SECRET, 1_700_000_000);
        let v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        let header = format!("t=1700000000,v1={},v1={v1},v0=abc", "00".repeat(32));
        assert_eq!(check(Some(&header), BODY, SECRET, 1_700_000_000), Ok(()));
    }

    #[test]
    fn a_changed_body_another_secret_or_an_old_timestamp_is_refused() {
        let header = sign(BODY, SECRET, 1_700_000_000);
        assert_eq!(
            check(Some(&header), b"{}", SECRET, 1_700_000_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            check(Some(&header), BODY, b"whsec_other", 1_700_000_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            check(Some(&header), BODY, SECRET, 1_700_000_301),
            Err(SignatureError::Stale {
                skew_s: 301,
                max_s: 300
            })
        );
    }

    #[test]
    fn a_missing_or_malformed_header_is_named() {
        assert_eq!(check(None, BODY, SECRET, 0), Err(SignatureError::Missing));
        for header in ["", "t=1", &format!("v1={}", "ab".repeat(32)), "t=x,v1=ab"] {
            let refused = check(Some(header), BODY, SECRET, 1).unwrap_err();
            assert!(
                refused
                    .to_string()
                    .starts_with("malformed Stripe-Signature header"),
                "{header}: {refused}"
            );
        }
    }

    #[test]
    fn a_v1_entry_that_is_not_64_hex_digits_is_refused_as_malformed() {
        for v1 in [
            "zz".repeat(32),
            "ab".repeat(31),
            "ab".repeat(33),
            "ab".into(),
        ] {
            let header = format!("t=1,v1={v1}");
            let refused = check(Some(&header), BODY, SECRET, 1);
            assert_eq!(refused, Err(SignatureError::NotASignature), "{header}");
            let message = refused.unwrap_err().to_string();
            assert!(message.contains("malformed") && message.contains("64 hex digits"));
        }
    }

    /// The flood of issue 17: thousands of `v1` entries, each of which used to cost one
    /// HMAC of the whole body. The header is refused as malformed, naming the limit.
    #[test]
    fn more_entries_than_the_limit_are_refused_as_malformed_naming_it() {
        let v1 = format!(",v1={}", "ab".repeat(32));
        let header = format!("t=1{}", v1.repeat(8));
        let limits = SignatureLimits {
            max_bytes: 1 << 20,
            max_entries: 8,
        };
        let refused = verify(Some(&header), BODY, SECRET, 1, limits);
        assert_eq!(refused, Err(SignatureError::TooManyEntries { max: 8 }));
        let message = refused.unwrap_err().to_string();
        assert!(
            message.starts_with("malformed Stripe-Signature header"),
            "{message}"
        );
        assert!(
            message.contains("[stripe] webhook_max_signature_entries (8)"),
            "{message}"
        );
        // Exactly at the limit is read.
        let header = format!("t=1{}", v1.repeat(7));
        assert_eq!(
            verify(Some(&header), BODY, SECRET, 1, limits),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_header_longer_than_the_limit_is_refused_as_malformed_naming_it() {
        let header = format!("t=1,v1={}{}", "ab".repeat(32), " ".repeat(1024));
        let refused = check(Some(&header), BODY, SECRET, 1);
        assert_eq!(
            refused,
            Err(SignatureError::TooLong {
                bytes: header.len(),
                max: 1024
            })
        );
        let message = refused.unwrap_err().to_string();
        assert!(
            message.starts_with("malformed Stripe-Signature header"),
            "{message}"
        );
        assert!(
            message.contains("exceeds [stripe] webhook_max_signature_bytes (1024)"),
            "{message}"
        );
    }

    /// The header is read without the body or the secret (so a refusal costs no MAC),
    /// and the body's MAC is one value compared with every entry: [`SignatureHeader::
    /// matches`] takes the MAC, not the body.
    #[test]
    fn the_header_is_read_before_and_apart_from_the_one_mac() {
        let good = sign(BODY, SECRET, 1_700_000_000);
        let v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        let header = format!("t=1700000000,v1={},v1={v1}", "00".repeat(32));
        let parsed = SignatureHeader::parse(&header, LIMITS).unwrap();
        assert_eq!(parsed.timestamp, 1_700_000_000);
        assert_eq!(parsed.signatures.len(), 2);
        let expected = mac(SECRET, parsed.timestamp, BODY);
        assert!(parsed.matches(&expected));
        assert!(!parsed.matches(&mac(SECRET, parsed.timestamp, b"{}")));
    }
}
