//! The internal note queued when a session's model budget runs out: the session
//! stopped and a person takes over. It goes through the note outbox like a held
//! call's note, anchored on a `blocked` execution of the pseudo-tool `model.chat` so
//! the outbox's marker and retry logic apply unchanged.

use rusqlite::Connection;
use serde_json::json;

use super::store as model_store;
use crate::approvals::store::{self as exec_store, Execution, OutboxNote, Status};
use crate::audit::{self, AuditEvent, AuditRecord};
use crate::gateway::note::marker;
use crate::secrets::Redactor;
use crate::session::SessionScope;

/// Marks the budget spent and, the first time, records the blocked model call, queues
/// the note and writes the audit row, all in the caller's transaction. True the first
/// time.
pub fn queue(
    conn: &Connection,
    scope: &SessionScope,
    why: &str,
    now_ms: i64,
    redactor: &Redactor,
) -> rusqlite::Result<bool> {
    if !model_store::mark_exhausted(conn, &scope.session_id, &scope.thread_id, now_ms)? {
        return Ok(false);
    }
    let id = format!("ex_{}", uuid::Uuid::now_v7().simple());
    let because = format!("model budget spent: {why}");
    let exec = Execution {
        id: id.clone(),
        session_id: scope.session_id.clone(),
        thread_id: scope.thread_id.clone(),
        agent: scope.agent.clone(),
        tool: "model.chat".into(),
        args: "{}".into(),
        account: String::new(),
        binding_hash: String::new(),
        diagnosis: None,
        verdict: "block".into(),
        because: because.clone(),
        rule_line: None,
        policy_hash: String::new(),
        status: Status::Blocked,
        summary: None,
        expires_at_ms: None,
        reviewer: None,
        decision_message: None,
        decided_at_ms: Some(now_ms),
        result: None,
        error: None,
        attempts: 0,
        created_at_ms: now_ms,
        finished_at_ms: Some(now_ms),
    };
    exec_store::insert(conn, &exec)?;
    let marker = marker(&id);
    let why = redactor.redact(why);
    let text = format!(
        "The agent's session stopped: its model budget is spent ({why}). \
         A person takes over this thread from here; the agent will not answer again.\n\n{marker}\n"
    );
    let markdown = format!(
        "**The agent's session stopped: its model budget is spent**\n\n{why}.\n\n\
         A person takes over this thread from here; the agent will not answer again.\n\n_{marker}_\n"
    );
    let note = OutboxNote {
        execution_id: id.clone(),
        thread_id: scope.thread_id.clone(),
        marker,
        text,
        markdown,
        attempts: 0,
    };
    exec_store::enqueue_note(conn, &note, now_ms)?;
    let record = AuditRecord {
        execution_id: Some(id),
        session_id: Some(scope.session_id.clone()),
        thread_id: Some(scope.thread_id.clone()),
        agent: Some(scope.agent.clone()),
        tool: Some("model.chat".into()),
        args: Some(json!({})),
        decision: Some("block".into()),
        rule: Some(because),
        outcome: Some("budget_exhausted".into()),
        ..AuditRecord::new(AuditEvent::Blocked)
    };
    audit::append(conn, &record, redactor)?;
    Ok(true)
}
