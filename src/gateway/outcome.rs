//! How a decided call ended: what its run produced ([`Ran`]: the record and the
//! answer), and the write of its final status and audit step ([`write_outcome`]),
//! shared by the write path and the read path.

use serde_json::Value;

use super::gate::CallReply;
use crate::audit::AuditEvent;
use crate::executions::{self, AuditStep, Execution, Status, store as exec_store};
use crate::secrets::Redactor;

/// A decided call's run: what to record and what to answer.
pub(super) struct Ran {
    pub record: Outcome,
    pub reply: CallReply,
}

/// Writes how a call ended (its final status, result or error, limit charges given
/// back on a definite failure) and its audit step, inside the caller's transaction.
pub(super) fn write_outcome(
    conn: &rusqlite::Connection,
    redactor: &Redactor,
    exec: &Execution,
    outcome: &Outcome,
    duration: i64,
    now: i64,
) -> rusqlite::Result<()> {
    let (status, result, error) = match outcome {
        Outcome::Succeeded(result) => (Status::Succeeded, Some(result.to_string()), None),
        Outcome::Failed(error) => (Status::Failed, None, Some(error.as_str())),
        Outcome::Unknown(error) => (Status::NeedsCheck, None, Some(error.as_str())),
    };
    exec_store::finish(conn, &exec.id, status, result.as_deref(), error, now)?;
    if status == Status::Failed {
        exec_store::release_charges(conn, &exec.id)?;
    }
    let step = match error {
        None => AuditStep::new(AuditEvent::Ran).outcome(Some("ok")),
        Some(error) => AuditStep::new(AuditEvent::Failed).outcome(Some(error)),
    };
    executions::audit(conn, redactor, exec, step.duration_ms(duration))
}

/// How a sent call ended, as recorded.
pub(super) enum Outcome {
    Succeeded(Value),
    /// Definitely not done: its limit charges are given back.
    Failed(String),
    /// Perhaps done, on a provider without idempotency keys: a person must check.
    Unknown(String),
}
