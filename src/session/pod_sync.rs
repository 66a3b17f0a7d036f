//! A session whose workspace lives in a pod (Kubernetes, through the relay) rather
//! than in the worktree the container mounts: before the worktree is committed (a
//! checkpoint, a stop), the pod's files are brought into it. Implemented above
//! `session` (`relay::pod_workspace`) and handed in at construction; `None` (Docker,
//! or no relay listener) leaves every commit as it was.
//!
//! Between checkpoints the supervisor also syncs a running session every
//! [`PodSync::sync_every`]: its pod's work is pulled into the worktree when it changed,
//! so a pod that dies before its stop loses at most that much. A sync, a checkpoint's
//! pull and commit, and a stop's pull and commit of one thread never overlap (the
//! supervisor's per-thread worktree lock, `supervisor/sync.rs`).

use std::time::Duration;

use crate::ids::SessionId;

/// Brings a pod's workspace into its session's worktree.
#[async_trait::async_trait]
pub trait PodSync: Send + Sync {
    /// Asks the session's relay for its workspace and waits until it is in the
    /// worktree. `Ok(false)` when the session has no pod workspace (nothing to bring);
    /// an error when its relay did not send it in time or sent something refused.
    async fn pull(&self, session_id: &SessionId) -> anyhow::Result<bool>;
    /// Forgets the session (it stopped): its relay's next request finds nothing.
    fn forget(&self, session_id: &SessionId);
    /// As [`PodSync::pull`], but the relay sends its work only when it changed since
    /// the last bundle this gateway took (the first one of a session is always sent).
    async fn sync(&self, session_id: &SessionId) -> anyhow::Result<bool> {
        self.pull(session_id).await
    }
    /// How often a running session is synced; `None`: never.
    fn sync_every(&self) -> Option<Duration> {
        None
    }
}
