//! Sessions: one per support thread, each with its own container and git branch.
//!
//! The [`Supervisor`] is the only place that changes a session's state. It is an actor:
//! intake, the sandbox API and the approvals service send it messages, and it answers
//! them one at a time, so two deliveries for one thread can never start two containers.
//! Slow work (git, Docker) runs in spawned tasks that report back with a message; while
//! a thread has such an operation in flight, the supervisor starts nothing else for it.
//!
//! The database is the truth: a session's row says what should exist, and on start-up
//! and every `reconcile_every` the supervisor makes the containers match it (adopting,
//! reaping, resuming). Parked sandboxes (warm starts) belong to the [`SandboxPool`],
//! never to reconciliation: a session's start takes one for its agent when the pool
//! has one (`launch="warm"`) and starts a container otherwise (`launch="cold"`).
//! Every container carries this instance's label; the supervisor
//! never touches one without it.

pub mod agent_text;
pub mod agents;
pub mod notes;
pub mod pod_sync;
pub mod pool;
pub mod publish;
pub mod settings;
pub mod store;
mod supervisor;
mod workspace;

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_leases;

use std::path::PathBuf;

use crate::ids::{SessionId, ThreadId};

pub use agents::{AgentBook, AgentDefinition, AllowedModels, HarnessCommand};
pub use notes::{StopNotes, StopReason};
pub use pod_sync::PodSync;
pub use pool::{PoolSettings, SandboxPool};
pub use publish::{BranchPublisher, GithubPublisher};
pub use settings::SessionSettings;
pub use store::{SessionRow, SessionState};
pub use supervisor::{
    Checkpoint, CheckpointError, MIN_AGENT_GAP_MS, PushState, Supervisor, SupervisorHandle,
    SupervisorInbox, SupervisorParts,
};
pub use workspace::{CommitReport, PreparedWorktree, WorkspaceOps};

/// What a session's sandbox API knows about the session it serves. The socket a request
/// arrives on decides which scope it gets; nothing in the request can change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionScope {
    pub session_id: SessionId,
    pub thread_id: ThreadId,
    pub agent: String,
    pub customer_id: Option<String>,
    pub customer_email: Option<String>,
    /// The thread's lease under which this instance serves the session: every write the
    /// gate and the model proxy make for the session carries it
    /// ([`crate::store::leases::fence`]), so once another instance has taken the thread
    /// over the database refuses them (`session_moved`), whatever this process believes.
    pub lease: crate::store::leases::Lease,
}

/// Serves the sandbox API on a session's own unix socket.
#[async_trait::async_trait]
pub trait SessionApi: Send + Sync {
    /// Starts (or restarts, after threadgate restarted) the listener at `socket_dir/api.sock`.
    async fn open(&self, scope: SessionScope, socket_dir: PathBuf) -> anyhow::Result<()>;
    /// Stops the session's listener; idempotent.
    async fn close(&self, session_id: &str);
}

/// The secrets a session needs: those its agent asks for (and is granted), and every
/// stored value, which commits are scanned for.
#[async_trait::async_trait]
pub trait SecretSource: Send + Sync {
    /// The secrets `agent` asks for; fails naming any that are not granted to it.
    async fn for_agent(
        &self,
        agent: &str,
        asked: &[String],
    ) -> anyhow::Result<Vec<(String, crate::secrets::SecretString)>>;
    /// Every stored secret.
    async fn all(&self) -> anyhow::Result<Vec<(String, crate::secrets::SecretString)>>;
}

/// Errors the supervisor reports to operators.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session for thread {0}")]
    UnknownThread(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("the supervisor has stopped")]
    Stopped,
}

#[async_trait::async_trait]
impl SecretSource for crate::secrets::SecretStore {
    async fn for_agent(
        &self,
        agent: &str,
        asked: &[String],
    ) -> anyhow::Result<Vec<(String, crate::secrets::SecretString)>> {
        Ok(self.resolve_for_agent(agent, asked).await?)
    }

    async fn all(&self) -> anyhow::Result<Vec<(String, crate::secrets::SecretString)>> {
        Ok(self.all_values().await?)
    }
}
