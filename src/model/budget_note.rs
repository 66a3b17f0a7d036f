//! The internal note queued when a session's model budget runs out: the session
//! stopped and a person takes over (written by `approvals::stop_note`, like every note
//! of a session that stopped on its own).

use rusqlite::Connection;

use super::store as model_store;
use crate::approvals::stop_note::{self, StopNote};
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
    let note = StopNote {
        key: "budget",
        tool: "model.chat",
        headline: "its model budget is spent".into(),
        detail: why.to_owned(),
        outcome: "budget_exhausted",
    };
    stop_note::queue(conn, scope, &note, now_ms, redactor)
}
