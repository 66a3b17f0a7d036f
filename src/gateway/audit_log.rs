//! The gateway's audit rows, written inside the same transaction as the state change
//! they describe.

use rusqlite::Connection;

use crate::approvals::store::Execution;
use crate::audit::{self, AuditEvent, AuditRecord};
use crate::secrets::Redactor;
use crate::session::SessionScope;

/// Appends one event about an execution.
pub fn record(
    conn: &Connection,
    redactor: &Redactor,
    exec: &Execution,
    event: AuditEvent,
    outcome: Option<&str>,
    reviewer: Option<&str>,
    duration_ms: Option<i64>,
) -> rusqlite::Result<()> {
    record_with_policy(
        conn,
        redactor,
        exec,
        event,
        outcome,
        reviewer,
        duration_ms,
        &exec.policy_hash,
    )
}

/// [`record`] naming the policy hash in force at this step (a re-check after approval
/// records the current policy's hash beside the one that held the call).
#[allow(clippy::too_many_arguments)]
pub fn record_with_policy(
    conn: &Connection,
    redactor: &Redactor,
    exec: &Execution,
    event: AuditEvent,
    outcome: Option<&str>,
    reviewer: Option<&str>,
    duration_ms: Option<i64>,
    policy_hash: &str,
) -> rusqlite::Result<()> {
    let args: serde_json::Value = serde_json::from_str(&exec.args).unwrap_or_default();
    let redacted = super::gate::redact_args(redactor, &args);
    let rule = match exec.rule_line {
        Some(line) => format!("{} (line {line})", exec.because),
        None => exec.because.clone(),
    };
    let rec = AuditRecord {
        at_ms: exec_now(conn),
        execution_id: Some(exec.id.clone()),
        event,
        session_id: Some(exec.session_id.clone()),
        thread_id: Some(exec.thread_id.clone()),
        agent: Some(exec.agent.clone()),
        tool: Some(exec.tool.clone()),
        args: Some(redacted),
        decision: Some(exec.verdict.clone()),
        rule: Some(rule),
        policy_hash: Some(policy_hash.to_owned()),
        reviewer: reviewer.map(str::to_owned),
        outcome: outcome.map(str::to_owned),
        duration_ms,
    };
    audit::append(conn, &rec, redactor)?;
    Ok(())
}

/// Appends a call refused before any decision (out of scope, a secret in the
/// arguments). The arguments are not recorded.
pub fn refusal(
    conn: &Connection,
    redactor: &Redactor,
    scope: &SessionScope,
    tool: &str,
    reason: &str,
    policy_hash: &str,
    now_ms: i64,
) -> rusqlite::Result<()> {
    let rec = AuditRecord {
        at_ms: now_ms,
        execution_id: None,
        event: AuditEvent::Refused,
        session_id: Some(scope.session_id.clone()),
        thread_id: Some(scope.thread_id.clone()),
        agent: Some(scope.agent.clone()),
        tool: Some(tool.to_owned()),
        args: None,
        decision: Some("refused".into()),
        rule: Some(reason.to_owned()),
        policy_hash: Some(policy_hash.to_owned()),
        reviewer: None,
        outcome: None,
        duration_ms: None,
    };
    audit::append(conn, &rec, redactor)?;
    Ok(())
}

fn exec_now(_conn: &Connection) -> i64 {
    chrono::Utc::now().timestamp_millis()
}
