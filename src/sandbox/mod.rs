//! Sandboxes: one locked-down Docker container per session.
//!
//! The orchestrator talks to containers only through [`SandboxRuntime`]. The real
//! implementation, [`DockerRuntime`], drives the Docker engine with bollard; the
//! in-memory [`FakeRuntime`] lets orchestrator tests run without an engine.
//!
//! Every container [`DockerRuntime`] starts has no network (`network_mode: none`), a
//! read-only root filesystem, a writable `/workspace` bind, a tmpfs `/tmp`, no
//! capabilities, `no-new-privileges`, a non-root user, resource limits, and labels that
//! name the threadgate instance, the session and the thread. Its only way out is the
//! session's unix socket, bind-mounted at `/run/threadgate`. Secrets arrive as read-only
//! files under `/run/secrets`, written to a per-session directory on a host tmpfs: never
//! in the environment, labels, command or logs.
//!
//! A runtime may also keep sandboxes *parked* for warm starts ([`SandboxRuntime::park`],
//! [`SandboxRuntime::adopt`]): started ahead of any thread with nothing of one inside
//! (labels name only the instance, the pool and the slot), and handed one thread's
//! workspace, socket and secrets on adoption. A sandbox that was ever adopted is never
//! parked again. The pool that keeps them (`session::pool`) knows no backend.
//!
//! The sandbox image itself is built by `scripts/build-sandbox-image.sh` from
//! `sandbox/Dockerfile`.

mod docker;
mod docker_pool;
mod fake;
mod host;
pub mod k8s;
mod slot;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use async_trait::async_trait;

use crate::ids::{SessionId, ThreadId};

pub use docker::DockerRuntime;
pub use fake::FakeRuntime;
pub use k8s::KubeRuntime;

/// Label naming the threadgate instance that owns a container.
pub const LABEL_INSTANCE: &str = "threadgate.instance";
/// Label naming the session a container belongs to.
pub const LABEL_SESSION: &str = "threadgate.session";
/// Label naming the support thread a container's session works on.
pub const LABEL_THREAD: &str = "threadgate.thread";

/// Label naming the pool (the agent definition) a parked sandbox was started for.
pub const LABEL_POOL: &str = "threadgate.pool";
/// Label naming a parked sandbox's slot: a random id, never a session's or a thread's.
pub const LABEL_SLOT: &str = "threadgate.slot";

/// Where the workspace is mounted inside the container.
pub const CONTAINER_WORKSPACE: &str = "/workspace";
/// Where the session's socket directory is mounted inside the container.
pub const CONTAINER_SOCKET_DIR: &str = "/run/threadgate";
/// Where the session's secret files appear inside the container.
pub const CONTAINER_SECRETS_DIR: &str = "/run/secrets";

/// The uid and gid a container runs as when threadgate itself runs as root (the `agent`
/// user of `sandbox/Dockerfile`).
pub const SANDBOX_UID: u32 = 10001;

/// Manages the containers of one threadgate instance.
///
/// Implementations touch only containers labelled with their own instance id, so
/// several instances (and parallel tests) can share one Docker engine.
#[async_trait]
pub trait SandboxRuntime: Send + Sync {
    /// Creates and starts a container for `spec`; returns once it is running.
    ///
    /// On failure nothing is left behind: no container, no secrets directory.
    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, SandboxError>;

    /// Stops and removes a container (by id or name) and its secrets directory.
    ///
    /// Idempotent: a container that is already gone is `Ok`. A container that belongs
    /// to another instance is refused with [`SandboxError::NotOwned`].
    async fn stop(&self, container_id: &str) -> Result<(), SandboxError>;

    /// Lists this instance's containers, running or not, and no one else's: those
    /// started for a session and those adopted by one (named by the adoption record,
    /// or with empty ids when that record cannot be read, so reconciliation removes
    /// them). Parked sandboxes are not listed here (see [`SandboxRuntime::list_parked`]).
    async fn list(&self) -> Result<Vec<SandboxInfo>, SandboxError>;

    /// Removes this instance's secrets directories whose session has no container
    /// (left by a crash, or by a container removed behind threadgate's back), and the
    /// host side of parked sandboxes that have none. Returns how many were removed.
    /// Meant for start-up and periodic reconciliation.
    async fn reap_orphan_secrets(&self) -> Result<usize, SandboxError>;

    /// Whether the engine answers and `image` exists in it (images are never pulled):
    /// what `/readyz` reports. A missing image is [`SandboxError::ImageMissing`].
    async fn check_ready(&self, image: &str) -> Result<(), SandboxError>;

    /// Starts a sandbox ahead of any thread, for the pool of `spec.pool`: it runs
    /// `spec`'s command with nothing of a thread inside (empty workspace, no socket, no
    /// secrets; labels name only the instance, the pool and the slot). It is listed by
    /// [`SandboxRuntime::list_parked`], never by [`SandboxRuntime::list`], until it is
    /// adopted. Removed with [`SandboxRuntime::stop`]; a failed park leaves nothing.
    ///
    /// A runtime without warm starts answers [`SandboxError::PoolUnsupported`].
    async fn park(&self, spec: &ParkSpec) -> Result<ParkedSandbox, SandboxError> {
        let _ = spec;
        Err(SandboxError::PoolUnsupported {
            reason: "this sandbox runtime keeps no parked sandboxes".into(),
        })
    }

    /// Hands a parked sandbox to `spec`'s session: first records the adoption durably
    /// with the runtime (from then on the sandbox is the session's, listed by
    /// [`SandboxRuntime::list`] with its session and thread, and never parked again),
    /// then brings in the workspace, the secrets and, last, the socket. `spec`'s image,
    /// limits, command and environment were fixed when it was parked and are not
    /// applied.
    ///
    /// On failure the sandbox is removed (never returned to the pool) with its secrets,
    /// except when it was adopted before: that is refused with
    /// [`SandboxError::NotAdoptable`] and left to the session that adopted it.
    async fn adopt(
        &self,
        parked: &ParkedSandbox,
        spec: &SandboxSpec,
    ) -> Result<SandboxHandle, SandboxError> {
        let _ = (parked, spec);
        Err(SandboxError::PoolUnsupported {
            reason: "this sandbox runtime keeps no parked sandboxes".into(),
        })
    }

    /// This instance's parked sandboxes (never adopted), running or not. A runtime
    /// without warm starts has none.
    async fn list_parked(&self) -> Result<Vec<ParkedSandbox>, SandboxError> {
        Ok(Vec::new())
    }

    /// The verifier of the tokens this runtime's sandboxes' relays present in place of a
    /// minted credential (claimed and adopted parked pods' service-account tokens); none
    /// for a runtime whose sandboxes all carry a minted credential or no relay.
    fn pod_token_verifier(&self) -> Option<std::sync::Arc<dyn PodTokenVerifier>> {
        None
    }
}

/// What a parked sandbox runs: everything of a sandbox that belongs to no thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkSpec {
    /// The pool it is parked in: the agent definition's name (a label).
    pub pool: String,
    /// The image to run.
    pub image: String,
    /// Memory, CPU and process limits.
    pub limits: Limits,
    /// Overrides the image's command when set (the agent's command).
    pub command: Option<Vec<String>>,
    /// Environment variables: nothing of a thread (no thread or session id), no secret.
    pub env: Vec<(String, String)>,
}

/// A parked sandbox, as [`SandboxRuntime::park`] and [`SandboxRuntime::list_parked`]
/// report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedSandbox {
    /// The runtime's id of the sandbox (Docker's container id, the pod's name).
    pub container_id: String,
    /// Its name, `threadgate-<instance>-pool-<slot>` (a pod's
    /// `tg-<instance>-pool-<slot>-<hash>`).
    pub name: String,
    /// The pool (agent definition) it was parked for.
    pub pool: String,
    /// Its slot id (random).
    pub slot: String,
    /// The image it runs.
    pub image: String,
    /// When it was started, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Whether it is running and its slot is as parking left it (nothing mounted over
    /// its directories, no adoption recorded): only a clean sandbox may be adopted.
    pub clean: bool,
}

/// Makes the credential a sandbox's relay presents to the gateway (the Kubernetes
/// backend writes it into the session's Secret). Implemented by the gateway's relay
/// credentials (`relay::RelayCredentials`), which any instance sharing the master key
/// verifies: handed to the runtime at construction so `sandbox` needs nothing above it.
pub trait RelayMinter: Send + Sync {
    /// A fresh credential for `session`, useless for any other session.
    fn mint(&self, session: &SessionId) -> crate::secrets::SecretString;
}

/// The longest pod token a relay may present (a projected service-account token is a
/// JWT of one to two kilobytes).
pub const MAX_POD_TOKEN_LEN: usize = 4096;

/// Why a pod's token reaches no session. Says nothing of the token's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PodTokenError {
    /// Not a token the API server vouches for with the relay's audience and the
    /// sandbox service account, or not a pod-bound one.
    #[error("the pod token is not valid")]
    Invalid,
    /// Authentic (or not yet asked), but of no pod adopted for a session here.
    #[error("the pod token is of no pod adopted for a session here")]
    Unknown,
    /// The API server could not be asked: refused, never taken as valid.
    #[error("the API server cannot review the pod token now")]
    Unavailable,
}

/// Verifies the token a claimed or parked sandbox's relay presents (the pod-bound
/// service-account token the kubelet projects, as no per-session credential can be in a
/// warm pod): the one session its pod was adopted for. Implemented by the Kubernetes
/// backend's `TokenReviewer`, handed to the gateway's relay listener.
#[async_trait::async_trait]
pub trait PodTokenVerifier: Send + Sync {
    /// The session `token`'s pod was adopted for.
    async fn session_of(
        &self,
        token: &crate::secrets::SecretString,
    ) -> Result<SessionId, PodTokenError>;

    /// Waits at most `hold` for `token`'s pod to be adopted: answers as soon as it is
    /// (a parked pod's relay is told of its adoption, instead of asking again and
    /// again). Only an authentic token may wait, and one wait per pod at a time: a later
    /// wait for the same pod takes the earlier one's place ([`AdoptionWait::Superseded`]).
    /// A verifier that cannot wait answers at once (the default).
    async fn wait_adopted(
        &self,
        token: &crate::secrets::SecretString,
        hold: std::time::Duration,
    ) -> Result<AdoptionWait, PodTokenError> {
        let _ = hold;
        match self.session_of(token).await {
            Ok(session) => Ok(AdoptionWait::Adopted(session)),
            Err(PodTokenError::Unknown) => Ok(AdoptionWait::NotYet),
            Err(e) => Err(e),
        }
    }
}

/// What a wait for a pod's adoption ([`PodTokenVerifier::wait_adopted`]) came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdoptionWait {
    /// The pod is adopted for this session.
    Adopted(SessionId),
    /// Not adopted within the wait: ask again.
    NotYet,
    /// A later wait for the same pod took this one's place.
    Superseded,
    /// As many waits are held as the verifier allows: ask again later.
    TooMany,
    /// The pod was parked by another instance (named), the only one that adopts it:
    /// wait there.
    Elsewhere(String),
}

/// Everything needed to start one session's container.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The session this container serves (a label, and part of the container name).
    pub session_id: SessionId,
    /// The support thread the session works on (a label).
    pub thread_id: ThreadId,
    /// The image to run, e.g. `threadgate-sandbox:latest`.
    pub image: String,
    /// Host directory mounted read-write at `/workspace` (the session's git worktree).
    pub workspace_dir: PathBuf,
    /// Host directory holding the session's unix socket, mounted at `/run/threadgate`.
    pub socket_dir: PathBuf,
    /// Secrets granted to the session, as `(NAME, value)`: each becomes the read-only
    /// file `/run/secrets/NAME`. NAME is `[A-Za-z0-9_.-]+` and does not start with `.`.
    pub secrets: Vec<(String, SecretBytes)>,
    /// Memory, CPU and process limits.
    pub limits: Limits,
    /// Overrides the image's command when set.
    pub command: Option<Vec<String>>,
    /// Environment variables; never secret values (start refuses a value that contains
    /// one of the spec's secrets).
    pub env: Vec<(String, String)>,
}

/// Resource limits for one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit in bytes (swap is not allowed beyond it).
    pub memory_bytes: u64,
    /// CPU limit in units of 10^-9 CPUs (1.5 CPUs is 1_500_000_000).
    pub nano_cpus: u64,
    /// Maximum number of processes and threads.
    pub pids: u64,
}

impl Default for Limits {
    /// 1 GiB of memory, one CPU, 256 processes.
    fn default() -> Self {
        Limits {
            memory_bytes: 1 << 30,
            nano_cpus: 1_000_000_000,
            pids: 256,
        }
    }
}

/// A started container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxHandle {
    /// Docker's container id.
    pub container_id: String,
    /// The container's name, `threadgate-<instance>-<session>` (sanitised).
    pub name: String,
}

/// One of this instance's containers, as [`SandboxRuntime::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// Docker's container id.
    pub container_id: String,
    /// The session label.
    pub session_id: String,
    /// The thread label.
    pub thread_id: String,
    /// Whether the container is running right now.
    pub running: bool,
}

pub use crate::secrets::SecretBytes;

/// Why a sandbox operation failed. Messages never contain secret values.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The Docker engine could not be reached or its API version negotiated.
    #[error("cannot connect to the docker engine: {0}")]
    Connect(#[source] bollard::errors::Error),
    /// The instance id cannot label containers or name directories.
    #[error("invalid instance id {instance:?}: use 1 or more of [A-Za-z0-9_-]")]
    InvalidInstance {
        /// The instance id given.
        instance: String,
    },
    /// The spec cannot be started as given.
    #[error("invalid sandbox spec for session {session:?}: {reason}")]
    InvalidSpec {
        /// The session id from the spec.
        session: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The image to run does not exist in the engine (images are never pulled).
    #[error(
        "image {image:?} not found in the docker engine; build it with scripts/build-sandbox-image.sh"
    )]
    ImageMissing {
        /// The image reference from the spec.
        image: String,
    },
    /// A container (or secrets directory) for this session already exists.
    #[error("a sandbox named {name:?} already exists; stop it first")]
    AlreadyExists {
        /// The container name.
        name: String,
    },
    /// The container is not labelled with this instance's id.
    #[error("container {container:?} does not belong to this threadgate instance")]
    NotOwned {
        /// The container id or name that was asked for.
        container: String,
    },
    /// The secrets root is not on a memory filesystem, so secrets would reach a disk.
    #[error("secrets root {path:?} is not on a tmpfs (found {fs_type:?})")]
    SecretsRootNotTmpfs {
        /// The configured secrets root.
        path: PathBuf,
        /// The filesystem type found there.
        fs_type: String,
    },
    /// A Docker API call failed.
    #[error("docker {action} failed for {target:?}: {source}")]
    Docker {
        /// What was being done, e.g. `create container`.
        action: &'static str,
        /// The container or image it was done to.
        target: String,
        /// The engine's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// A Kubernetes API call failed.
    #[error("kubernetes {action} {target:?} failed: {source}")]
    Kube {
        /// What was being done, e.g. `create`.
        action: &'static str,
        /// The object (or kind of objects) it was done to.
        target: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The cluster is not set up for sessions (a missing warm pool, CRD or CA).
    #[error("the kubernetes sandbox backend cannot run: {reason}")]
    Cluster {
        /// What is missing, naming the setting that says where to look.
        reason: String,
    },
    /// A pod or claim did not become ready; it was removed.
    #[error("sandbox {name:?} did not become ready within {waited:?} and was removed: {reason}")]
    NotReady {
        /// The pod or claim.
        name: String,
        /// How long it was given.
        waited: std::time::Duration,
        /// What was seen last, or why it can never be ready.
        reason: String,
    },
    /// The runtime cannot keep parked sandboxes here (another backend, or threadgate is
    /// not root and cannot mount a thread's directories into a running container).
    #[error("warm starts are not available: {reason}")]
    PoolUnsupported {
        /// Why.
        reason: String,
    },
    /// The parked sandbox was adopted before (or is not a parked sandbox of this
    /// instance): it is never handed to another session.
    #[error("sandbox {container:?} cannot be adopted: {reason}")]
    NotAdoptable {
        /// The container id.
        container: String,
        /// Why.
        reason: String,
    },
    /// A host filesystem operation failed.
    #[error("cannot {action} {path:?}: {source}")]
    Io {
        /// What was being done, e.g. `write secret file`.
        action: &'static str,
        /// The host path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Turns an id into a string safe for container names and path components:
/// ASCII letters, digits, `_` and `-` are kept, anything else becomes `-`.
pub fn sanitise_id(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The container name for a session of an instance: `threadgate-<instance>-<session>`,
/// both parts sanitised with [`sanitise_id`].
pub fn container_name(instance_id: &str, session_id: &str) -> String {
    format!(
        "threadgate-{}-{}",
        sanitise_id(instance_id),
        sanitise_id(session_id)
    )
}
