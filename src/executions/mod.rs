//! Executions: a tool call frozen as it was decided, the states it moves through, the
//! table that holds it (with its limit charges and the note outbox), and the audit
//! steps written beside each change.
//!
//! The gateway creates executions and runs them; the approvals service decides held
//! ones and runs them once. Both use this module; it uses neither.

pub mod audit;
mod frozen;
pub mod labels;
pub mod store;
pub mod thread_calls;
pub mod trail;

pub use audit::record as audit;
pub use audit::record_all as audit_all;
pub use frozen::{binding_hash, canonical_args, redact_args};
pub use store::{Execution, OutboxNote, Status};
