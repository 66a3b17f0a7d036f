//! How a decided call ended: what its run produced ([`Ran`]: the record and the
//! answer), and the write of its final status and audit step ([`write_outcome`]),
//! shared by the write path and the read path.

use serde_json::Value;

use super::gate::CallReply;
use crate::audit::{AuditEvent, AuditRecord};
use crate::executions::{self, Execution, Status, store as exec_store, trail};
use crate::secrets::Redactor;

/// A decided call's run: what to record and what to answer.
pub(super) struct Ran {
    pub record: Outcome,
    pub reply: CallReply,
}

/// Writes how a call `runner` (this instance) sent ended (its final status, result or
/// error, limit charges given back on a definite failure) and its audit step, inside the
/// caller's transaction; refused, writing nothing, once the call is not `runner`'s
/// running call any more (`exec_store::finish`).
/// `one_write` is [`outcome_is_one_write`], worked out once by the caller, which sends
/// this with no transaction around it on Postgres when it is set: then the status and
/// the step go together (`executions::audit::finish_recorded`: one statement there),
/// and nothing else may be written.
pub(super) fn write_outcome(
    conn: &crate::store::Conn<'_>,
    redactor: &Redactor,
    (exec, runner): (&Execution, &str),
    (outcome, one_write): (&Outcome, bool),
    (duration, now): (i64, i64),
) -> crate::store::Result<()> {
    let (status, result, error) = outcome.fields();
    let step = outcome.step().duration_ms(duration);
    let fields = (status, result.as_deref(), error);
    if one_write {
        let exec = (exec, runner);
        return executions::audit::finish_recorded(conn, redactor, exec, fields, now, step);
    }
    exec_store::finish(conn, &exec.id, runner, fields, now)?;
    if status == Status::Failed {
        exec_store::release_charges(conn, &exec.id)?;
    }
    if trail::was_held(exec) {
        trail::enqueue(conn, &trail::ran(exec, status, error, redactor), now)?;
    }
    executions::audit(conn, redactor, exec, step)
}

/// Whether [`write_outcome`] writes only the status and the audit step (no charges
/// given back: the call did not definitely fail; no note of a held call's run), so that
/// on Postgres it is one statement and needs no transaction around it.
pub(super) fn outcome_is_one_write(exec: &Execution, outcome: &Outcome) -> bool {
    !matches!(outcome, Outcome::Failed(_)) && !trail::was_held(exec)
}

/// Writes a read decided on a snapshot, as it is sent: its row (`running`, sent by
/// `runner`) with its requested and decided steps, under the session's `lease` (checked
/// by the row's insert: a stale lease writes nothing). Such a read reserves no limit
/// amounts. On Postgres one statement, sent with no transaction around it
/// (`Db::write_single`). Its outcome is written by [`write_outcome`] once it is back.
pub(super) fn write_sent_read(
    conn: &crate::store::Conn<'_>,
    redactor: &Redactor,
    lease: &crate::store::leases::Lease,
    exec: &Execution,
    runner: &str,
) -> crate::store::Result<()> {
    let steps = vec![
        AuditRecord::new(AuditEvent::Requested),
        AuditRecord::new(AuditEvent::Decided),
    ];
    executions::audit::insert_recorded(conn, redactor, (exec, runner), lease, steps)
}

/// When an outcome's commit must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutcomeCommit {
    /// Before the agent is answered: a write's outcome on a provider without
    /// idempotency keys, an approved call's, a call recovery re-sends, and a read whose
    /// decision was committed without its flush (its rule reserves limit amounts:
    /// `decide::record`).
    Flushed,
    /// Whenever the log is next synced: a read decided on a snapshot, whose decision (row
    /// and audit steps) is already on disk, usually written after its answer
    /// (`trailing`); a write the agent made on a provider that deduplicates by
    /// idempotency key (`Gate::execute_write`), written before its answer. A crash may
    /// lose it; the row is then found `running` by recovery, as a call cut off
    /// mid-flight is, and re-sent (a write with its key); meanwhile an identical write
    /// waits on it and is not sent.
    Unflushed,
}

/// How a sent call ended, as recorded.
pub(super) enum Outcome {
    Succeeded(Value),
    /// Definitely not done: its limit charges are given back.
    Failed(String),
    /// Perhaps done, on a provider without idempotency keys: a person must check.
    Unknown(String),
}

impl Outcome {
    /// The execution's final status, result and error.
    fn fields(&self) -> (Status, Option<String>, Option<&str>) {
        match self {
            Outcome::Succeeded(result) => (Status::Succeeded, Some(result.to_string()), None),
            Outcome::Failed(error) => (Status::Failed, None, Some(error.as_str())),
            Outcome::Unknown(error) => (Status::NeedsCheck, None, Some(error.as_str())),
        }
    }

    /// The audit step that records it.
    fn step(&self) -> AuditRecord {
        match self.fields().2 {
            None => AuditRecord::new(AuditEvent::Ran).outcome(Some("ok")),
            Some(error) => AuditRecord::new(AuditEvent::Failed).outcome(Some(error)),
        }
    }
}
