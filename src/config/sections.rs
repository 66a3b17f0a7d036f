//! The sections of the settings that belong to no other module: `[plain]`, `[repo]`,
//! `[sandbox]`, `[server]`, `[store]` and `[telemetry]`, each with the defaults a fresh machine
//! runs on. Durations are written as `30m`, `4h`, `300s` (`humantime_serde`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::secrets::SecretString;

/// Metrics, readiness and trace export.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Where Prometheus metrics are served (`GET /metrics`); none (the default) serves
    /// none. Its own listener: never the people's listener, never a session socket.
    pub metrics_listen: Option<SocketAddr>,
    /// How long each `/readyz` check may take before it counts as failed.
    #[serde(with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// An OpenTelemetry collector's OTLP/HTTP endpoint (e.g. `http://127.0.0.1:4318`);
    /// spans are exported there when set. Needs a build with the `otlp` feature.
    pub otlp_endpoint: Option<String>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            metrics_listen: None,
            ready_timeout: Duration::from_secs(2),
            otlp_endpoint: None,
        }
    }
}

/// Limits on the people's listener (`listen`); session sockets use the same timeouts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Open connections at most on `listen`; further ones are closed at once.
    pub max_connections: usize,
    /// Open connections at most from one client address (an IPv6 /64 counts as one),
    /// so one address cannot fill `max_connections`; 0 turns the per-address cap off
    /// (e.g. behind a reverse proxy that connects from one address).
    pub max_connections_per_address: usize,
    /// Time a client has to send a request's headers, counted from connecting or from
    /// the end of its previous response (so also the keep-alive idle timeout).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time a client has to send a request's body.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// The longest a reviewer's name waits between sign-in attempts once it has had
    /// failures from anywhere (the per-name back-off; a name from one client address
    /// is locked separately).
    #[serde(with = "humantime_serde")]
    pub sign_in_backoff_max: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            max_connections: 1024,
            max_connections_per_address: 64,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            sign_in_backoff_max: Duration::from_secs(15),
        }
    }
}

/// Plain: the webhook intake and the helpdesk connector.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlainSettings {
    /// Set only through `THREADGATE_PLAIN_SIGNING_SECRET` or `signing_secret_file`.
    #[serde(skip)]
    pub signing_secret: Option<SecretString>,
    /// A file holding the webhook signing secret.
    pub signing_secret_file: Option<PathBuf>,
    #[serde(with = "humantime_serde")]
    pub max_skew: Duration,
    pub max_body_bytes: usize,
    /// Plain's API base (the connector appends `/graphql/v1`).
    pub api_url: String,
    /// The name of the secret holding Plain's API key.
    pub api_key_secret: String,
    /// The label type the escalation connector applies, if any.
    pub escalation_label_type_id: Option<String>,
    /// Plain's web link to a thread, with `{thread_id}` in it; the review page links
    /// threads there when set.
    pub thread_url: Option<String>,
    /// The label types that show a thread's state in Plain, each optional.
    pub labels: crate::connectors::helpdesk::StateLabels,
}

impl Default for PlainSettings {
    fn default() -> Self {
        PlainSettings {
            signing_secret: None,
            signing_secret_file: None,
            max_skew: Duration::from_secs(300),
            max_body_bytes: 1024 * 1024,
            api_url: "https://core-api.uk.plain.com".into(),
            api_key_secret: "plain_api_key".into(),
            escalation_label_type_id: None,
            labels: crate::connectors::helpdesk::StateLabels::default(),
            thread_url: None,
        }
    }
}

/// The repository whose branches sessions work on.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepoSettings {
    pub path: PathBuf,
    pub default_branch: Option<String>,
    pub remote: Option<String>,
    /// New files one commit of a worktree may add; past it the rest are left out.
    pub max_commit_files: usize,
    /// New bytes of content one commit may add; past it the rest are left out.
    pub max_commit_bytes: u64,
    /// How often a running session's worktree is committed and its branch pushed to
    /// `remote` (a checkpoint another instance can resume from); `0s`: only when the
    /// agent asks and when the session stops.
    #[serde(with = "humantime_serde")]
    pub checkpoint_every: Duration,
}

impl RepoSettings {
    /// The caps on one commit, as the workspace applies them.
    pub fn commit_limits(&self) -> crate::workspace::CommitLimits {
        crate::workspace::CommitLimits {
            max_files: self.max_commit_files,
            max_bytes: self.max_commit_bytes,
        }
    }
}

impl Default for RepoSettings {
    fn default() -> Self {
        let limits = crate::workspace::CommitLimits::default();
        RepoSettings {
            path: PathBuf::from("."),
            default_branch: None,
            remote: None,
            max_commit_files: limits.max_files,
            max_commit_bytes: limits.max_bytes,
            checkpoint_every: Duration::from_secs(5 * 60),
        }
    }
}

/// The container every session runs in.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    /// `docker` (the default) or `kubernetes`.
    pub backend: crate::sandbox::k8s::Backend,
    pub image: String,
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
    /// A directory on a tmpfs where secret files are written for bind-mounting.
    pub secrets_root: PathBuf,
    /// `[sandbox.kubernetes]`: used when `backend = "kubernetes"`.
    pub kubernetes: crate::sandbox::k8s::KubernetesSettings,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            backend: crate::sandbox::k8s::Backend::Docker,
            image: "threadgate-sandbox:latest".into(),
            memory_bytes: 1024 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            secrets_root: PathBuf::from("/dev/shm/threadgate"),
            kubernetes: crate::sandbox::k8s::KubernetesSettings::default(),
        }
    }
}

/// Where the state lives (`[store]`).
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// A Postgres URL (`postgres://user:password@host:port/database`) shared by several
    /// instances. Empty (the default): SQLite, `threadgate.db` in `data_dir`. Shown only
    /// without its password. Its `sslmode` (`disable`, `prefer`, `require`, `verify-ca`,
    /// `verify-full`) and `sslrootcert` (a PEM file) say how TLS is used.
    pub url: String,
    /// Postgres connections one instance keeps open at most (at least 1).
    #[serde(deserialize_with = "pool_size")]
    pub pool_size: usize,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            url: String::new(),
            pool_size: crate::store::DEFAULT_POOL_SIZE,
        }
    }
}

fn pool_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("pool_size must be at least 1"));
    }
    Ok(n)
}

impl StoreSettings {
    /// The Postgres URL, when one is set.
    pub fn postgres_url(&self) -> Option<&str> {
        Some(self.url.trim()).filter(|u| !u.is_empty())
    }
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &crate::store::redact(&self.url))
            .field("pool_size", &self.pool_size)
            .finish()
    }
}
