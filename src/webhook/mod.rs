//! Intake of Plain's webhooks: `POST /webhooks/plain` verifies a delivery's signature,
//! reads the few envelope fields threadgate needs, refuses stale or oversized
//! deliveries, and durably stores each Plain event once (retries are answered 2xx and
//! dropped) before answering. The orchestrator is told of new session-relevant events
//! only after they are on disk; starting containers happens after the answer.
//!
//! - [`signature`]: `Plain-Request-Signature` (HMAC-SHA256 of the raw body).
//! - [`envelope`]: the fields read from a delivery and its [`EventClass`].
//! - [`store`]: the `events` table.
//! - [`intake`]: the axum route tying them together.

pub mod envelope;
pub mod intake;
pub mod signature;
pub mod store;

pub use envelope::{ActorKind, Customer, Envelope, EnvelopeError, EventClass};
pub use intake::{IntakeConfig, IntakeState, StoredEvent, router};
pub use signature::{
    SIGNATURE_HEADER, SignatureError, SigningSecret, SigningSecretError, sign, verify_signature,
};
pub use store::InsertOutcome;

#[cfg(test)]
mod tests;
