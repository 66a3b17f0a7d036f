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

use super::StripeConnector;
use crate::api_error::ApiError;
use crate::connectors::Credential;

/// The header Stripe signs its deliveries in.
pub const SIGNATURE_HEADER: &str = "Stripe-Signature";
/// How far a delivery's timestamp may be from now (Stripe's libraries' default).
pub const TOLERANCE: Duration = Duration::from_secs(300);
/// The largest event body read.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Why a delivery's signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Stripe-Signature` header.
    #[error("missing Stripe-Signature header")]
    Missing,
    /// The header has no `t=` timestamp or no `v1=` signature.
    #[error("malformed Stripe-Signature header: expected t=TIMESTAMP and v1=HEX")]
    Malformed,
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

/// Checks `header` (the raw `Stripe-Signature` value) for `body` under `secret`, at
/// `now_s` (seconds since the epoch). Comparisons are in constant time.
pub fn verify(
    header: Option<&str>,
    body: &[u8],
    secret: &[u8],
    now_s: i64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", hex_sig)) => {
                if let Ok(bytes) = hex::decode(hex_sig) {
                    signatures.push(bytes);
                }
            }
            _ => {}
        }
    }
    let (Some(timestamp), false) = (timestamp, signatures.is_empty()) else {
        return Err(SignatureError::Malformed);
    };
    let skew_s = now_s.saturating_sub(timestamp).saturating_abs();
    if skew_s.unsigned_abs() > TOLERANCE.as_secs() {
        return Err(SignatureError::Stale {
            skew_s,
            max_s: TOLERANCE.as_secs(),
        });
    }
    let matches = signatures
        .iter()
        .any(|signature| mac(secret, timestamp, body).verify_slice(signature).is_ok());
    if matches {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The signature Stripe would send for `body` at `timestamp` (for tests and tools that
/// play Stripe).
pub fn sign(body: &[u8], secret: &[u8], timestamp: i64) -> String {
    let signature = mac(secret, timestamp, body).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(signature))
}

/// The HMAC-SHA256 of `TIMESTAMP.BODY` under `secret`, as Stripe computes it.
fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length, so the constructor cannot fail.
    #[allow(clippy::expect_used)]
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// What the endpoint needs.
#[derive(Clone)]
pub struct EventsState {
    /// The connector whose memory the events keep true.
    pub stripe: Arc<StripeConnector>,
    /// The endpoint's signing secret, read from the secrets store at each delivery.
    pub secret: Credential,
    /// Milliseconds since the epoch.
    pub clock: Arc<dyn Fn() -> i64 + Send + Sync>,
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
    let now_s = (state.clock)().div_euclid(1000);
    if let Err(e) = verify(header, &body, secret.expose_secret().as_bytes(), now_s) {
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
    let kind = event["type"].as_str().unwrap_or_default();
    let id = event["id"].as_str().unwrap_or_default();
    if matches!(kind, "customer.updated" | "customer.deleted") {
        let Some(customer) = event["data"]["object"]["id"].as_str() else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                format!("{kind} event {id} has no data.object.id"),
            );
        };
        state.stripe.forget_customer(customer);
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

    #[test]
    fn a_signature_made_by_sign_verifies() {
        let header = sign(BODY, SECRET, 1_700_000_000);
        assert_eq!(verify(Some(&header), BODY, SECRET, 1_700_000_010), Ok(()));
    }

    #[test]
    fn one_matching_v1_among_several_is_enough() {
        let good = sign(BODY, SECRET, 1_700_000_000);
        let v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        let header = format!("t=1700000000,v1={},v1={v1},v0=abc", "00".repeat(32));
        assert_eq!(verify(Some(&header), BODY, SECRET, 1_700_000_000), Ok(()));
    }

    #[test]
    fn a_changed_body_another_secret_or_an_old_timestamp_is_refused() {
        let header = sign(BODY, SECRET, 1_700_000_000);
        assert_eq!(
            verify(Some(&header), b"{}", SECRET, 1_700_000_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(Some(&header), BODY, b"whsec_other", 1_700_000_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(Some(&header), BODY, SECRET, 1_700_000_301),
            Err(SignatureError::Stale {
                skew_s: 301,
                max_s: 300
            })
        );
    }

    #[test]
    fn a_missing_or_malformed_header_is_named() {
        assert_eq!(verify(None, BODY, SECRET, 0), Err(SignatureError::Missing));
        for header in ["", "t=1", "v1=ab", "t=x,v1=ab", "t=1,v1=zz"] {
            assert_eq!(
                verify(Some(header), BODY, SECRET, 1),
                Err(SignatureError::Malformed),
                "{header}"
            );
        }
    }
}
