//! `POST /webhooks/plain`: verify, read, deduplicate and durably store a delivery, then
//! answer; the orchestrator hears of it only after it is on disk.
//!
//! The checks run in this order, and a refusal changes no state:
//! 1. body size (413), enforced while reading so a lying `Content-Length` or a chunked
//!    body cannot get past it;
//! 2. `Plain-Request-Signature` over the raw bytes (401), before anything is parsed;
//! 3. the envelope fields threadgate needs (400, naming the field);
//! 4. `webhookMetadata.webhookDeliveryAttemptTimestamp` within `max_skew` of now (401:
//!    a signed but stale or future delivery is a replay, which Plain's own SDK also
//!    reports as a signature verification failure);
//! 5. insert unless the id is already stored, in one statement (`INSERT … ON CONFLICT
//!    (event_id) DO NOTHING RETURNING seq`): on SQLite a savepoint of a group commit, on
//!    Postgres a transaction of its own, one round trip ([`Db::write_single`]); a
//!    duplicate answers 200 and does nothing else.
//!
//! Only then is the answer 200, and only then is the event sent on `notify` (never
//! for a duplicate or an [`EventClass::Ignored`] event).

use crate::clock::Clock;
use crate::ids::ThreadId;
use crate::secrets::ExposeSecret as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;
use tokio::sync::mpsc::UnboundedSender;

use super::envelope::{Envelope, EnvelopeError, EventClass};
use super::signature::{SIGNATURE_HEADER, SignatureError, SigningSecret, verify_signature};
use super::store::{self, InsertOutcome};
use crate::api_error::ApiError;
use crate::store::{Db, StoreError};

/// Limits and the secret for the intake endpoint.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// The workspace's request-signing secret.
    pub signing_secret: SigningSecret,
    /// The largest body accepted, in bytes (413 beyond it).
    pub max_body_bytes: usize,
    /// How far a delivery attempt's timestamp may be from now, either way.
    pub max_skew: Duration,
}

impl IntakeConfig {
    /// Plain's deliveries are a few KiB; 1 MiB leaves room for long emails.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
    /// The window Plain's own SDK uses.
    pub const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(300);

    /// A configuration with the default limits.
    pub fn new(signing_secret: SigningSecret) -> IntakeConfig {
        IntakeConfig {
            signing_secret,
            max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
            max_skew: Self::DEFAULT_MAX_SKEW,
        }
    }
}

/// A stored event the orchestrator has to act on, sent after its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// The event's row in `events`.
    pub seq: i64,
    /// The thread it belongs to (only thread events are sent).
    pub thread_id: ThreadId,
    /// What it means for the thread's session; never [`EventClass::Ignored`].
    pub class: EventClass,
}

/// What the intake handler needs.
#[derive(Clone)]
pub struct IntakeState {
    /// Where events are stored.
    pub db: Db,
    /// Secret and limits.
    pub config: IntakeConfig,
    /// The time source for the freshness window and `received_at_ms`.
    pub clock: Clock,
    /// Told of each new session-relevant event once it is durably stored.
    pub notify: UnboundedSender<StoredEvent>,
}

/// The routes of the intake: `POST /webhooks/plain`.
pub fn router(state: IntakeState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/webhooks/plain", post(receive))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(Arc::new(state))
}

/// Why a delivery was refused, or failed.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("body larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot read the request body")]
    Unreadable,
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error("body is not valid UTF-8")]
    NotUtf8,
    #[error(
        "webhookMetadata.webhookDeliveryAttemptTimestamp is {skew_s} s from now, beyond the {max_s} s window"
    )]
    Stale { skew_s: i64, max_s: u64 },
    #[error("cannot store the event: {0}")]
    Store(#[from] StoreError),
}

impl Refusal {
    /// The answer's status and code.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Refusal::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Refusal::Unreadable | Refusal::NotUtf8 => (StatusCode::BAD_REQUEST, "unreadable"),
            Refusal::Envelope(_) => (StatusCode::BAD_REQUEST, "invalid_envelope"),
            Refusal::Signature(_) => (StatusCode::UNAUTHORIZED, "bad_signature"),
            Refusal::Stale { .. } => (StatusCode::UNAUTHORIZED, "stale"),
            Refusal::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The refusal's fixed metrics label.
    fn reason(&self) -> &'static str {
        match self {
            Refusal::TooLarge { .. } => "too_large",
            Refusal::Unreadable => "unreadable",
            Refusal::Signature(_) => "signature",
            Refusal::Envelope(_) => "envelope",
            Refusal::NotUtf8 => "not_utf8",
            Refusal::Stale { .. } => "stale",
            Refusal::Store(_) => "store_error",
        }
    }

    /// Logs the refusal and turns it into the answer. A 500 says nothing specific.
    fn into_answer(self, event_id: Option<&str>) -> Response {
        crate::metrics::delivery("refused", self.reason(), None);
        if let Refusal::Store(_) = self {
            tracing::error!(event_id, error = %self, "webhook delivery not stored");
            return ApiError::internal().into_response();
        }
        let (status, code) = self.status_and_code();
        tracing::warn!(event_id, status = status.as_u16(), reason = %self, "webhook delivery refused");
        ApiError::new(status, code, self.to_string()).into_response()
    }
}

#[tracing::instrument(
    name = "webhook_intake",
    skip_all,
    fields(event_id = tracing::field::Empty, thread_id = tracing::field::Empty)
)]
async fn receive(
    State(state): State<Arc<IntakeState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = std::time::Instant::now();
    let body = match read_body(body, state.config.max_body_bytes) {
        Ok(body) => body,
        Err(refusal) => return refusal.into_answer(None),
    };
    let signature = headers
        .get(SIGNATURE_HEADER)
        .map(|value| value.to_str().unwrap_or_default());
    if let Err(e) = verify_signature(
        state.config.signing_secret.expose_secret(),
        &body,
        signature,
    ) {
        return Refusal::from(e).into_answer(None);
    }
    let envelope = match Envelope::parse(&body) {
        Ok(envelope) => envelope,
        Err(e) => return Refusal::from(e).into_answer(None),
    };
    let span = tracing::Span::current();
    span.record("event_id", tracing::field::display(&envelope.id));
    if let Some(thread) = &envelope.thread_id {
        span.record("thread_id", tracing::field::display(thread));
    }
    match accept(&state, envelope, body, started).await {
        Ok(response) => response,
        Err((refusal, event_id)) => refusal.into_answer(Some(&event_id)),
    }
}

fn read_body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, Refusal> {
    match body {
        Ok(body) if body.len() <= limit => Ok(body),
        Ok(_)
        | Err(BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_))) => {
            Err(Refusal::TooLarge { limit })
        }
        Err(_) => Err(Refusal::Unreadable),
    }
}

/// Checks freshness, stores the event and notifies; the error carries the event id.
async fn accept(
    state: &IntakeState,
    envelope: Envelope,
    body: Bytes,
    started: std::time::Instant,
) -> Result<Response, (Refusal, String)> {
    let now = state.clock.now_ms();
    let skew_ms = now.saturating_sub(envelope.attempt_at_ms).saturating_abs();
    let max_ms = crate::clock::ms(state.config.max_skew);
    if skew_ms > max_ms {
        let refusal = Refusal::Stale {
            skew_s: skew_ms / 1000,
            max_s: state.config.max_skew.as_secs(),
        };
        return Err((refusal, envelope.id));
    }
    let Ok(text) = std::str::from_utf8(&body) else {
        return Err((Refusal::NotUtf8, envelope.id));
    };
    let text = text.to_owned();
    let class = envelope.class();
    let thread_id = envelope.thread_id.clone();
    let event_id = envelope.id.clone();
    let stored = state
        .db
        .write_single(move |conn| store::insert(conn, &envelope, &text, now))
        .await;
    let seq = match stored {
        Ok(InsertOutcome::Inserted { seq }) => seq,
        Ok(InsertOutcome::Duplicate) => {
            tracing::debug!(event_id, "duplicate webhook delivery ignored");
            crate::metrics::delivery("duplicate", "none", Some(started.elapsed()));
            return Ok(
                (StatusCode::OK, axum::Json(json!({ "status": "duplicate" }))).into_response(),
            );
        }
        Err(e) => return Err((Refusal::Store(e), event_id)),
    };
    tracing::debug!(
        event_id,
        seq,
        class = class.as_str(),
        "webhook event stored"
    );
    crate::metrics::delivery("stored", "none", Some(started.elapsed()));
    if let (Some(thread_id), false) = (thread_id, class == EventClass::Ignored) {
        let event = StoredEvent {
            seq,
            thread_id,
            class,
        };
        if state.notify.send(event).is_err() {
            // The event is durable; the orchestrator picks up unapplied events at start.
            tracing::warn!(event_id, seq, "no orchestrator listening for stored events");
        }
    }
    Ok((
        StatusCode::OK,
        axum::Json(json!({ "status": "stored", "seq": seq })),
    )
        .into_response())
}
