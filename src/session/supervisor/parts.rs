//! What the supervisor drives: its parts, handed over at spawn.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::sandbox::{Limits, SandboxRuntime};
use crate::session::SessionSettings;
use crate::session::{
    AgentBook, BranchPublisher, PodSync, SandboxPool, SecretSource, SessionApi, StopNotes,
    WorkspaceOps,
};
use crate::store::Db;
use crate::tasks::Tasks;

/// Everything the supervisor drives.
pub struct SupervisorParts {
    pub db: Db,
    /// This instance's id: the owner named in the session leases it takes (and the
    /// label on its containers, through the sandbox runtime).
    pub instance_id: String,
    pub sandbox: Arc<dyn SandboxRuntime>,
    pub workspaces: Arc<dyn WorkspaceOps>,
    pub api: Arc<dyn SessionApi>,
    pub agents: Arc<AgentBook>,
    pub secrets: Arc<dyn SecretSource>,
    pub image: String,
    pub limits: Limits,
    pub sockets_dir: PathBuf,
    pub settings: SessionSettings,
    pub default_agent: String,
    pub clock: Clock,
    /// Opens or updates a draft pull request when a session ends with pushed changes;
    /// `None` without a remote or a GitHub repository.
    pub publisher: Option<Arc<dyn BranchPublisher>>,
    /// Leaves a note on the thread when the supervisor stops a session on its own
    /// (a full workspace); `None` in tests that do not look at notes.
    pub notes: Option<Arc<dyn StopNotes>>,
    /// How often a running session's worktree is committed and pushed (`[repo]
    /// checkpoint_every`); zero: only when the agent asks and when it stops.
    pub checkpoint_every: Duration,
    /// The application's tasks: the actor, its tick and every start and stop it
    /// spawns run there, and shutdown waits for them.
    pub tasks: Tasks,
    /// Parked sandboxes for warm starts; `None` (or an empty pool) starts every
    /// session cold. Its refill loop runs in `tasks` from the supervisor's start.
    pub pool: Option<Arc<SandboxPool>>,
    /// Brings a pod's workspace into the worktree before each commit of it; `None`
    /// where no session runs in a pod (Docker).
    pub pod_sync: Option<Arc<dyn PodSync>>,
}
