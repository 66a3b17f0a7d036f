//! A session whose workspace lives in a pod (Kubernetes, through the relay) rather
//! than in the worktree the container mounts: before the worktree is committed (a
//! checkpoint, a stop), the pod's files are brought into it. Implemented above
//! `session` (`relay::pod_workspace`) and handed in at construction; `None` (Docker,
//! or no relay listener) leaves every commit as it was.

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
}
