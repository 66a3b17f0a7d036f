//! The audit rows of executions, written inside the same transaction as the state
//! change they describe.

use rusqlite::Connection;

use super::frozen::redact_args;
use super::store::Execution;
use crate::audit::{self, AuditEvent, AuditRecord};
use crate::secrets::Redactor;
use crate::session::SessionScope;

/// One step of an execution as the audit records it. Built with [`AuditStep::new`] and
/// the setters for what the step has (an outcome, a reviewer, a duration, the policy
/// hash in force when it differs from the one that decided the call).
#[derive(Debug, Clone, Copy)]
pub struct AuditStep<'a> {
    pub event: AuditEvent,
    pub outcome: Option<&'a str>,
    pub reviewer: Option<&'a str>,
    pub duration_ms: Option<i64>,
    /// The policy hash in force at this step; `None` is the execution's own.
    pub policy_hash: Option<&'a str>,
}

impl<'a> AuditStep<'a> {
    /// A step with nothing but its event.
    pub fn new(event: AuditEvent) -> AuditStep<'a> {
        AuditStep {
            event,
            outcome: None,
            reviewer: None,
            duration_ms: None,
            policy_hash: None,
        }
    }

    /// The step's outcome (an error, a reviewer's message, `ok`).
    pub fn outcome(mut self, outcome: Option<&'a str>) -> Self {
        self.outcome = outcome;
        self
    }

    /// The reviewer who took the step.
    pub fn reviewer(mut self, reviewer: &'a str) -> Self {
        self.reviewer = Some(reviewer);
        self
    }

    /// How long the step took.
    pub fn duration_ms(mut self, ms: i64) -> Self {
        self.duration_ms = Some(ms);
        self
    }

    /// The policy hash in force at this step (a re-check after approval records the
    /// current policy's hash beside the one that held the call).
    pub fn policy_hash(mut self, hash: &'a str) -> Self {
        self.policy_hash = Some(hash);
        self
    }
}

/// Appends one step of an execution; its arguments pass through [`redact_args`].
pub fn record(
    conn: &Connection,
    redactor: &Redactor,
    exec: &Execution,
    step: AuditStep<'_>,
) -> rusqlite::Result<()> {
    let args: serde_json::Value = serde_json::from_str(&exec.args).unwrap_or_default();
    let rule = match exec.rule_line {
        Some(line) => format!("{} (line {line})", exec.because),
        None => exec.because.clone(),
    };
    let rec = AuditRecord {
        at_ms: chrono::Utc::now().timestamp_millis(),
        execution_id: Some(exec.id.to_string()),
        event: step.event,
        session_id: Some(exec.session_id.to_string()),
        thread_id: Some(exec.thread_id.to_string()),
        agent: Some(exec.agent.clone()),
        tool: Some(exec.tool.clone()),
        args: Some(redact_args(redactor, &args)),
        decision: Some(exec.verdict.clone()),
        rule: Some(rule),
        policy_hash: Some(step.policy_hash.unwrap_or(&exec.policy_hash).to_owned()),
        reviewer: step.reviewer.map(str::to_owned),
        outcome: step.outcome.map(str::to_owned),
        duration_ms: step.duration_ms,
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
        session_id: Some(scope.session_id.to_string()),
        thread_id: Some(scope.thread_id.to_string()),
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
