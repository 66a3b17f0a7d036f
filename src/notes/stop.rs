//! The internal note queued when a session stops without a person asking (its model
//! budget is spent, its workspace is full, it asked for too many calls needing a
//! person): a person takes over the thread. It goes through the note outbox like a held
//! call's note, anchored on a `blocked` execution of a pseudo-tool (`model.chat`,
//! `session.workspace`, `session.holds`), so the outbox's marker and retry logic apply
//! unchanged, and the audit chain shows why the session stopped.
//!
//! The gateway (a session that floods people with holds), the model proxy (a spent
//! budget, a secret in the prompt) and the supervisor (a full workspace) queue it here.

use std::sync::Arc;

use crate::store::Conn;

use super::Outbox;
use super::held::new_marker;
use crate::audit::{AuditEvent, AuditRecord};
use crate::executions::audit::record;
use crate::executions::store::{self, Execution, OutboxNote, Status};
use crate::ids::ExecutionId;
use crate::secrets::Redactor;
use crate::session::{SessionScope, StopNotes, StopReason};

/// One reason a session stopped, as the note and the audit row tell it.
#[derive(Debug, Clone)]
pub struct StopNote {
    /// Distinguishes the reasons of one session: at most one note per session and key.
    pub key: &'static str,
    /// The pseudo-tool the audit row and the execution carry.
    pub tool: &'static str,
    /// What happened, completing "The agent's session stopped: …".
    pub headline: String,
    /// The particulars (passed through the redactor).
    pub detail: String,
    /// The audit row's outcome code.
    pub outcome: &'static str,
}

impl StopNote {
    /// The note for a stop the supervisor decided.
    pub fn for_reason(reason: &StopReason) -> StopNote {
        match reason {
            StopReason::WorkspaceFull { limit_bytes } => StopNote {
                key: "workspace",
                tool: "session.workspace",
                headline: "its workspace is full".into(),
                detail: format!(
                    "the agent filled the {} its /workspace may hold, and writes there fail",
                    human_bytes(*limit_bytes)
                ),
                outcome: "workspace_full",
            },
        }
    }

    /// The note of a session that asked for one more call needing a person while
    /// `limit` of its calls already waited for one (`[sessions] max_pending_holds`).
    pub fn too_many_holds(limit: usize) -> StopNote {
        StopNote {
            key: "holds",
            tool: "session.holds",
            headline: "it asked for more calls needing a person than may wait at once".into(),
            detail: format!(
                "it asked for another while {limit} of its calls waited for a person, \
                 past [sessions] max_pending_holds ({limit}); the calls already waiting \
                 can still be approved or denied"
            ),
            outcome: "too_many_holds",
        }
    }
}

/// Records the blocked pseudo-call, queues the note and writes the audit row, all in the
/// caller's transaction. False (and nothing written) when this session already has
/// the note for `note.key`.
pub fn queue(
    conn: &Conn<'_>,
    scope: &SessionScope,
    note: &StopNote,
    now_ms: i64,
    redactor: &Redactor,
) -> crate::store::Result<bool> {
    let id = ExecutionId::parse(format!("ex_stop_{}_{}", note.key, scope.session_id))
        .map_err(crate::store::SqlError::other)?;
    if store::get(conn, &id)?.is_some() {
        return Ok(false);
    }
    let because = format!("session stopped: {}", note.headline);
    let exec = blocked_execution(&id, scope, note, &because, now_ms);
    store::insert(conn, &exec)?;
    let marker = new_marker(&id);
    let (headline, detail) = (&note.headline, redactor.redact(&note.detail));
    let text = format!(
        "The agent's session stopped: {headline} ({detail}). \
         A person takes over this thread from here; the agent will not answer again.\n\n{marker}\n"
    );
    let markdown = format!(
        "**The agent's session stopped: {headline}**\n\n{detail}.\n\n\
         A person takes over this thread from here; the agent will not answer again.\n\n_{marker}_\n"
    );
    let outbox = OutboxNote {
        execution_id: id.clone(),
        thread_id: scope.thread_id.clone(),
        marker,
        text,
        markdown,
        attempts: 0,
    };
    store::enqueue_note(conn, &outbox, now_ms)?;
    crate::executions::labels::set_handed_to_person(conn, &scope.thread_id, now_ms)?;
    let step = AuditRecord::new(AuditEvent::Blocked).outcome(Some(note.outcome));
    record(conn, redactor, &exec, step)?;
    Ok(true)
}

fn blocked_execution(
    id: &ExecutionId,
    scope: &SessionScope,
    note: &StopNote,
    because: &str,
    now_ms: i64,
) -> Execution {
    Execution::by_threadgate(
        id,
        scope,
        note.tool,
        "{}".into(),
        ("block", Status::Blocked),
        because,
        now_ms,
    )
}

fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// The supervisor's [`StopNotes`], writing through the outbox's database and
/// waking it.
pub struct OutboxStopNotes {
    outbox: Arc<Outbox>,
}

impl OutboxStopNotes {
    pub fn new(outbox: Arc<Outbox>) -> OutboxStopNotes {
        OutboxStopNotes { outbox }
    }
}

#[async_trait::async_trait]
impl StopNotes for OutboxStopNotes {
    async fn stopped(&self, scope: &SessionScope, reason: &StopReason) -> anyhow::Result<()> {
        let (now, redactor) = (self.outbox.now(), self.outbox.redactor());
        let (scope, note) = (scope.clone(), StopNote::for_reason(reason));
        let first = self
            .outbox
            .db
            .write(move |c| {
                // Only the thread's owner notes why its session stopped.
                crate::store::leases::fence(c, &scope.lease)?;
                queue(c, &scope, &note, now, &redactor)
            })
            .await?;
        if first {
            self.outbox.wake();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(2 << 30), "2 GiB");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }
}
