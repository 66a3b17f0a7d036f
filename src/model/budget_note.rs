//! The internal notes queued when the model proxy stops a session on its own: its model
//! budget is spent, or a stored secret's value reached its prompt. Either way the
//! session may not call the model again and a person takes over (the note is written
//! by `notes::stop`, like every note of a session that stopped on its own).

use crate::store::Conn;

use super::store as model_store;
use crate::notes::stop::{self, StopNote};
use crate::secrets::Redactor;
use crate::session::SessionScope;

/// The note of a session whose model budget is spent (`why` says which limit).
pub fn budget(why: &str) -> StopNote {
    StopNote {
        key: "budget",
        tool: "model.chat",
        headline: "its model budget is spent".into(),
        detail: why.to_owned(),
        outcome: "budget_exhausted",
    }
}

/// The note of a session whose prompt held the value of the stored secret `name`: it
/// names the secret, never its value.
pub fn secret(name: &str) -> StopNote {
    StopNote {
        key: "secret",
        tool: "model.chat",
        headline: "a stored secret reached its prompt".into(),
        detail: format!(
            "the prompt held the value of the stored secret {name:?}; it was not sent to the model"
        ),
        outcome: "secret_in_prompt",
    }
}

/// Marks the session's model calls stopped and, the first time, records the blocked
/// model call, queues `note` and writes the audit row, all in the caller's transaction.
/// True the first time.
pub fn queue(
    conn: &Conn<'_>,
    scope: &SessionScope,
    note: &StopNote,
    now_ms: i64,
    redactor: &Redactor,
) -> crate::store::Result<bool> {
    if !model_store::mark_exhausted(conn, &scope.session_id, &scope.thread_id, now_ms)? {
        return Ok(false);
    }
    stop::queue(conn, scope, note, now_ms, redactor)
}
