//! Checkpoints: a running session's worktree committed onto its branch and the branch
//! pushed to the configured remote, while the container goes on, so that another
//! instance can take the thread over from the last one.
//!
//! A checkpoint is asked for by the agent (`POST /v1/checkpoint`, through
//! [`super::SupervisorHandle::checkpoint`]) or taken by the tick every `[repo]
//! checkpoint_every` while the session runs. Either way it is an operation in flight of
//! the actor, like a start or a stop: the thread is `busy` while it runs, so a stop
//! that comes meanwhile is recorded and carried out by the tick once the checkpoint has
//! reported back, and a checkpoint never starts while a start or stop is in flight.
//! Two commits of one worktree therefore never run at once, and the stop's commit
//! always sees the checkpoint's commit as its branch tip.
//!
//! A push that fails is logged (the remote's credentials replaced) and tried again at
//! the next checkpoint, whether or not that one commits anything; it never stops the
//! session.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::checkpoint_answer::Reply;
pub use super::checkpoint_answer::{Checkpoint, CheckpointError, PushState};
use super::handle::{Msg, Outcome};
use super::lifecycle::commit_worktree;
use super::parts::SupervisorParts;
use super::{Supervisor, SupervisorHandle};
use crate::ids::ThreadId;
use crate::session::store::{SessionRow, SessionState};
use tokio::sync::oneshot;

/// The agent may ask for a checkpoint at most this often (each one walks the worktree
/// and may push): one sooner is refused with the time to wait.
pub const MIN_AGENT_GAP_MS: i64 = 10_000;

/// The actor's memory of checkpoints, of the threads holding a slot only (per instance:
/// a new owner starts afresh, and the session's stop pushes whatever is left).
#[derive(Default)]
pub(super) struct Checkpoints {
    /// When each running thread's last checkpoint was taken, or it was first seen
    /// running: the next periodic one is due a period later.
    last_ms: HashMap<ThreadId, i64>,
    /// When each running thread's last checkpoint was taken: the agent's next one may
    /// come [`MIN_AGENT_GAP_MS`] later.
    taken_ms: HashMap<ThreadId, i64>,
    /// Threads whose last push failed: pushed again at the next checkpoint.
    unpushed: HashSet<ThreadId>,
}

impl SupervisorHandle {
    /// Commits the session's worktree and pushes its branch now, for its agent; answers
    /// once both are done (a failed push is an answer, not an error).
    pub async fn checkpoint(&self, thread_id: &ThreadId) -> Result<Checkpoint, CheckpointError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Checkpoint {
                thread: thread_id.clone(),
                reply,
            })
            .map_err(|_| CheckpointError::Stopped)?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }
}

impl Supervisor {
    /// The agent's checkpoint: taken unless the session is not running, busy, or asked
    /// again too soon.
    pub(super) async fn checkpoint_asked(&mut self, thread: &ThreadId, reply: Reply) {
        if self.busy.contains_key(thread) {
            let _ = reply.send(Err(CheckpointError::Busy));
            return;
        }
        let now = self.now();
        if let Some(last) = self.checkpoints.taken_ms.get(thread)
            && now - last < MIN_AGENT_GAP_MS
        {
            let retry_after_ms = MIN_AGENT_GAP_MS - (now - last);
            let _ = reply.send(Err(CheckpointError::TooSoon { retry_after_ms }));
            return;
        }
        match self.running(thread).await {
            Some(row) => self.spawn_checkpoint(row, Some(reply)),
            None => {
                let _ = reply.send(Err(CheckpointError::NotRunning));
            }
        }
    }

    /// The tick's checkpoints: every running session not busy whose last checkpoint is
    /// `checkpoint_every` old. A zero period turns them off.
    pub(super) async fn checkpoints_due(&mut self) {
        // Only threads holding a slot are remembered: an ended or idle one starts
        // afresh when it runs again (its stop pushed, or logged why not).
        let slots = &self.slots;
        self.checkpoints.taken_ms.retain(|t, _| slots.contains(t));
        self.checkpoints.last_ms.retain(|t, _| slots.contains(t));
        self.checkpoints.unpushed.retain(|t| slots.contains(t));
        let every = crate::clock::ms(self.parts.checkpoint_every);
        if every <= 0 {
            return;
        }
        let now = self.now();
        let last_ms = &mut self.checkpoints.last_ms;
        let due: Vec<ThreadId> = self
            .slots
            .iter()
            .filter(|t| !self.busy.contains_key(*t))
            .filter(|t| now - *last_ms.entry((*t).clone()).or_insert(now) >= every)
            .cloned()
            .collect();
        for thread in due {
            match self.running(&thread).await {
                Some(row) => self.spawn_checkpoint(row, None),
                None => {
                    self.checkpoints.last_ms.insert(thread, now);
                }
            }
        }
    }

    /// Records a finished checkpoint: a failed push is tried again next time.
    pub(super) fn checkpointed(&mut self, thread: &ThreadId, push: Option<PushState>) {
        match push {
            Some(PushState::Failed) => {
                self.checkpoints.unpushed.insert(thread.to_owned());
            }
            Some(PushState::Pushed | PushState::NoRemote) => {
                self.checkpoints.unpushed.remove(thread);
            }
            Some(PushState::NotNeeded) | None => {}
        }
    }

    /// The thread's session row when it runs here with a container.
    async fn running(&self, thread: &ThreadId) -> Option<SessionRow> {
        if !self.slots.contains(thread) {
            return None;
        }
        let row = self.session(thread).await?;
        (row.state == SessionState::Running && row.worktree.is_some()).then_some(row)
    }

    fn spawn_checkpoint(&mut self, row: SessionRow, reply: Option<Reply>) {
        let thread = row.thread_id.clone();
        self.busy.insert(thread.clone(), false);
        let now = self.now();
        self.checkpoints.last_ms.insert(thread.clone(), now);
        self.checkpoints.taken_ms.insert(thread.clone(), now);
        let retry_push = self.checkpoints.unpushed.contains(&thread);
        self.syncs.synced(&thread, now);
        let worktree = self.syncs.lock_of(&thread);
        let parts = self.parts.clone();
        let tx = self.tx.clone();
        let asked = reply.is_some();
        let span = tracing::info_span!("session_checkpoint", thread_id = %row.thread_id, session_id = %row.session_id, asked);
        let work = async move {
            // A sync in flight ends first; none starts until the commit is done.
            let worktree = super::sync::hold(worktree).await;
            let result = checkpoint_session(&parts, &row, retry_push).await;
            drop(worktree);
            let push = match &result {
                Ok(done) => Some(done.push),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "checkpoint failed");
                    None
                }
            };
            if let Some(reply) = reply {
                let _ = reply.send(result.map_err(|_| CheckpointError::Failed));
            }
            let _ = tx.send(Msg::Done {
                thread: row.thread_id,
                outcome: Outcome::Checkpointed { push },
            });
        };
        self.parts
            .tasks
            .spawn(tracing::Instrument::instrument(work, span));
    }
}

/// Commits the running session's worktree and pushes its branch when the commit moved
/// it or the last push failed (`retry_push`), and the branch holds changes.
async fn checkpoint_session(
    parts: &SupervisorParts,
    row: &SessionRow,
    retry_push: bool,
) -> anyhow::Result<Checkpoint> {
    let worktree = row
        .worktree
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the session has no worktree"))?;
    if let Some(pods) = &parts.pod_sync {
        pods.pull(&row.session_id).await?;
    }
    let secrets = parts.secrets.all().await?;
    let workspaces = parts.workspaces.clone();
    let thread = row.thread_id.clone();
    let branch = row.branch.clone();
    crate::tasks::Tasks::spawn_blocking(move || -> anyhow::Result<Checkpoint> {
        let report = commit_worktree(
            workspaces.as_ref(),
            &thread,
            &PathBuf::from(&worktree),
            &secrets,
        )?;
        let wanted = report.commit.is_some() || retry_push;
        let push = if !workspaces.has_remote() {
            PushState::NoRemote
        } else if !wanted || !workspaces.has_changes(&thread)? {
            PushState::NotNeeded
        } else {
            match workspaces.push(&thread) {
                Ok(()) => PushState::Pushed,
                Err(e) => {
                    // The workspace's errors name the remote with its credentials
                    // replaced.
                    tracing::warn!(thread = %thread, error = %format!("{e:#}"), "cannot push the checkpoint; tried again at the next one");
                    PushState::Failed
                }
            }
        };
        Ok(Checkpoint {
            branch,
            commit: report.commit,
            left_out: report.skipped.len(),
            push,
        })
    })
    .await?
}
