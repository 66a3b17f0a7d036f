//! `[sandbox.kubernetes]`: where and how sessions run when `[sandbox] backend =
//! "kubernetes"`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which runtime starts the sessions' sandboxes (`[sandbox] backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// One container per session on the local Docker engine.
    #[default]
    Docker,
    /// One pod (or agent-sandbox claim) per session on a Kubernetes cluster.
    Kubernetes,
}

/// Whether sessions are `SandboxClaim`s or plain pods (`sandbox.kubernetes.claims`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimMode {
    /// Claims where the cluster serves agent-sandbox's `sandboxclaims`, pods elsewhere.
    #[default]
    Auto,
    /// Always claims: a cluster without agent-sandbox is an error at start.
    Always,
    /// Always plain pods.
    Never,
}

/// The Kubernetes backend's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSettings {
    /// The namespace sandboxes are made in (threadgate's own by default).
    pub namespace: String,
    /// The `SandboxTemplate` plain pods are built like (the manifest's name), and that
    /// `check_ready` looks for when claims are used.
    pub template: String,
    /// The `SandboxWarmPool` claims name.
    pub warm_pool: String,
    /// Claims or plain pods.
    pub claims: ClaimMode,
    /// The pods' `runtimeClassName` (`gvisor`, `kata`), unset for the cluster default.
    pub runtime_class: Option<String>,
    /// The image of the relay sidecar (threadgate's own image).
    pub relay_image: String,
    /// The `https://` address of the gateway's relay listener, as the pods reach it.
    pub gateway_url: String,
    /// A PEM file with the CA that signed the relay listener's certificate; copied into
    /// each session's credential Secret. Required with this backend.
    pub ca_file: Option<PathBuf>,
    /// How long a sandbox may take to become ready before the start is undone.
    #[serde(with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// The size limit of the workspace volume (an `emptyDir`).
    pub workspace_bytes: u64,
    /// The relay sidecar's memory limit.
    pub relay_memory_bytes: u64,
    /// The relay sidecar's CPU limit in millicores.
    pub relay_millicpus: u64,
    /// Not a key of this table: `[relay.workspace]`'s caps, set by the application, so
    /// each pod's relay is started with them (`relay_args`).
    #[serde(skip)]
    pub relay_workspace_limits: crate::workspace::BundleLimits,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        KubernetesSettings {
            namespace: "threadgate".into(),
            template: "threadgate-sandbox".into(),
            warm_pool: "threadgate-sandbox".into(),
            claims: ClaimMode::Auto,
            runtime_class: None,
            relay_image: "threadgate:latest".into(),
            gateway_url: "https://threadgate-relay.threadgate.svc:8443".into(),
            ca_file: None,
            ready_timeout: Duration::from_secs(120),
            workspace_bytes: 2 << 30,
            relay_memory_bytes: 64 << 20,
            relay_millicpus: 200,
            relay_workspace_limits: crate::workspace::BundleLimits::default(),
        }
    }
}
