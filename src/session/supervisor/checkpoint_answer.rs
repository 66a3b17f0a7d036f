//! What a checkpoint answers: its outcome, its push, why it was refused, and where the
//! answer goes. A leaf of the supervisor: `handle` carries these in its messages and
//! `checkpoint` makes them.

use tokio::sync::oneshot;

/// What a checkpoint did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The thread's branch, e.g. `threadgate/th_…`.
    pub branch: String,
    /// The new commit, or `None` when the worktree matches the branch tip.
    pub commit: Option<String>,
    /// How many files were left out of the commit (a secret, a cap; the server's log
    /// names them).
    pub left_out: usize,
    /// What became of the push.
    pub push: PushState,
}

/// What became of a checkpoint's push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PushState {
    /// The remote has the branch's tip.
    Pushed,
    /// Nothing new to push (no commit, and the last push went through).
    NotNeeded,
    /// No remote is configured; the branch stays on this instance.
    NoRemote,
    /// The push failed; it is tried again at the next checkpoint.
    Failed,
}

impl PushState {
    /// The state's name on the wire, e.g. `not_needed`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a checkpoint was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// The session has no running container (starting, idle, queued, ended).
    #[error("the session is not running")]
    NotRunning,
    /// Another operation on the session (start, stop, checkpoint) is in flight.
    #[error("the session's workspace is busy (starting, stopping or checkpointing); try again")]
    Busy,
    /// The agent asked again sooner than [`MIN_AGENT_GAP_MS`] after the last one.
    #[error("a checkpoint was taken less than 10 s ago; try again in {retry_after_ms} ms")]
    TooSoon {
        /// How long to wait.
        retry_after_ms: i64,
    },
    /// The commit failed (logged).
    #[error("the checkpoint failed")]
    Failed,
    /// The supervisor has stopped.
    #[error("the supervisor has stopped")]
    Stopped,
}

/// Who asked for a checkpoint, and where its answer goes.
pub(super) type Reply = oneshot::Sender<Result<Checkpoint, CheckpointError>>;
