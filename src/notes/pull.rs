//! The internal note that tells a thread's people its session left a pull request for
//! an engineer to review: queued through the note outbox once per pull request (its
//! later updates queue nothing), anchored, like a stop note, on an execution of a
//! pseudo-tool ([`PULL_REQUEST_TOOL`]) so the outbox's marker and retries apply
//! unchanged and the audit chain shows the note. The pull request's own description
//! never lists that execution among the agent's calls.

use std::sync::Arc;

use crate::store::Conn;
use serde_json::json;

use super::Outbox;
use super::held::new_marker;
use crate::audit::{AuditEvent, AuditRecord};
use crate::connectors::github::PullRequest;
use crate::executions::audit::record;
use crate::executions::store::{self, Execution, OutboxNote, Status};
use crate::executions::thread_calls::PULL_REQUEST_TOOL;
use crate::ids::ExecutionId;
use crate::secrets::Redactor;
use crate::session::SessionScope;
use crate::session::publish::PullNotes;

/// Records the pseudo-call, queues the note and writes the audit row, all in the
/// caller's transaction. False (and nothing written) when the pull request already has
/// its note.
pub fn queue(
    conn: &Conn<'_>,
    scope: &SessionScope,
    repo: &str,
    pull: &PullRequest,
    now_ms: i64,
    redactor: &Redactor,
) -> crate::store::Result<bool> {
    let id = ExecutionId::parse(format!("ex_pull_{repo}_{}", pull.number))
        .map_err(crate::store::SqlError::other)?;
    if store::get(conn, &id)?.is_some() {
        return Ok(false);
    }
    let exec = pull_execution(&id, scope, repo, pull, now_ms);
    store::insert(conn, &exec)?;
    let marker = new_marker(&id);
    let url = &pull.html_url;
    let text = format!(
        "The agent's changes wait for an engineer's review in a pull request: {url}\n\n\
         It says what the agent found, every call it made with what was decided, the \
         files it changed and what the session cost.\n\n{marker}\n"
    );
    let markdown = format!(
        "**The agent's changes wait for an engineer's review:** {url}\n\n\
         The pull request says what the agent found, every call it made with what was \
         decided, the files it changed and what the session cost.\n\n_{marker}_\n"
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
    let step = AuditRecord::new(AuditEvent::Ran).outcome(Some("pull_request_note"));
    record(conn, redactor, &exec, step)?;
    Ok(true)
}

fn pull_execution(
    id: &ExecutionId,
    scope: &SessionScope,
    repo: &str,
    pull: &PullRequest,
    now_ms: i64,
) -> Execution {
    let args = json!({"repo": repo, "number": pull.number, "url": pull.html_url});
    Execution::by_threadgate(
        id,
        scope,
        PULL_REQUEST_TOOL,
        crate::executions::canonical_args(&args),
        ("run", Status::Succeeded),
        "threadgate published the session's pull request",
        now_ms,
    )
}

/// The publisher's [`PullNotes`], writing through the outbox's database and
/// waking it.
pub struct OutboxPullNotes {
    outbox: Arc<Outbox>,
    repo: String,
}

impl OutboxPullNotes {
    /// Notes for the pull requests of `repo` (`owner/name`).
    pub fn new(outbox: Arc<Outbox>, repo: String) -> OutboxPullNotes {
        OutboxPullNotes { outbox, repo }
    }
}

#[async_trait::async_trait]
impl PullNotes for OutboxPullNotes {
    async fn opened(&self, scope: &SessionScope, pull: &PullRequest) -> anyhow::Result<()> {
        let (now, redactor) = (self.outbox.now(), self.outbox.redactor());
        let (scope, pull, repo) = (scope.clone(), pull.clone(), self.repo.clone());
        let first = self
            .outbox
            .db
            .write(move |c| {
                crate::store::leases::fence(c, &scope.lease)?;
                queue(c, &scope, &repo, &pull, now, &redactor)
            })
            .await?;
        if first {
            self.outbox.wake();
        }
        Ok(())
    }
}
