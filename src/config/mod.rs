//! Settings: one typed struct, layered with `figment` from the defaults, an optional
//! TOML file and `THREADGATE_*` environment variables (each later layer wins).
//!
//! Every key of the file can be set from the environment: `THREADGATE_` and the key's
//! path in capitals, sections joined by `__` (`[sessions] max_pending_holds` is
//! `THREADGATE_SESSIONS__MAX_PENDING_HOLDS`); a few older short names stay (see
//! `env.rs`). A wrong value is one [`ConfigError`] naming the key and where it came from
//! (`file:line` or the variable), never the value. Secret values (the Plain signing
//! secret, the master key) are read from the environment or a file outside the layering,
//! held in [`crate::secrets::SecretString`] and never printed.

mod env;
mod error;
mod load;
mod provider;
mod sections;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use self::error::{ConfigError, Origin};
pub use self::provider::ProviderSettings;
pub use self::sections::{
    PlainSettings, RepoSettings, SandboxSettings, ServerSettings, StoreSettings, TelemetrySettings,
};
use crate::secrets::SecretString;
pub use crate::session::SessionSettings;

/// Everything threadgate reads at start.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Holds the database, worktrees and session sockets.
    pub data_dir: PathBuf,
    /// Names this instance on the containers it starts and in the session leases it
    /// holds; every process sharing a database needs its own. When unset, generated once
    /// and kept in `data_dir` (the file `instance_id`), so each data directory is one
    /// instance.
    pub instance_id: Option<String>,
    /// The SQLite database file. Empty (the default): `threadgate.db` in `data_dir`.
    /// Several instances on one machine share one file by naming it here, each with
    /// its own `data_dir` (worktrees, sockets, instance id).
    pub database_file: PathBuf,
    /// The listener for webhooks and people (approvals, admin). Never reachable from a
    /// sandbox, which has no network.
    pub listen: SocketAddr,
    /// The address people use to reach `listen`, used in approval links.
    pub public_url: String,
    /// The policy file every call is decided against.
    pub policy_file: PathBuf,
    /// Agent definitions (`NAME.md`: YAML front matter, instructions as the body).
    pub agents_dir: PathBuf,
    /// Playbooks the agent can load (`NAME/SKILL.md`).
    pub skills_dir: PathBuf,
    /// The agent a new thread's session runs.
    pub default_agent: String,
    /// Where the master key of the secrets store is read from when
    /// `THREADGATE_MASTER_KEY` is not set. Empty (the default): `master.key` in
    /// `data_dir`, wherever that is set (see [`Settings::master_key_path`]).
    pub master_key_file: PathBuf,
    /// The master key itself, base64 of 32 bytes: set only through
    /// `THREADGATE_MASTER_KEY` (never read from the file); when set, `master_key_file`
    /// is not used.
    #[serde(skip)]
    pub master_key: Option<SecretString>,
    /// Where the audit chain's head is kept outside the database (see
    /// [`crate::audit::anchor`]). Empty (the default): `audit.anchor` in `data_dir`.
    pub audit_anchor_file: PathBuf,
    pub plain: PlainSettings,
    /// The Stripe connector; a key left out of the table takes its default.
    #[serde(
        default = "provider::default_stripe",
        deserialize_with = "provider::stripe",
        serialize_with = "provider::serialize_stripe"
    )]
    pub stripe: ProviderSettings,
    /// The GitHub connector; a key left out of the table takes its default.
    #[serde(
        default = "provider::default_github",
        deserialize_with = "provider::github",
        serialize_with = "provider::serialize_github"
    )]
    pub github: ProviderSettings,
    pub repo: RepoSettings,
    pub sandbox: SandboxSettings,
    pub sessions: SessionSettings,
    /// The model proxy on the session socket (`[model]`).
    pub model: crate::model::ModelSettings,
    /// MCP on the session socket (`[mcp]`).
    pub mcp: crate::mcp::McpSettings,
    pub server: ServerSettings,
    /// Where the state lives (`[store]`): SQLite in `data_dir`, or a shared Postgres.
    pub store: StoreSettings,
    /// Metrics, readiness and trace export (`[telemetry]`).
    pub telemetry: TelemetrySettings,
    /// The review page (`[review]`; `[review.oidc]`: sign-in through an OpenID provider).
    pub review: crate::review::oidc::ReviewSettings,
    /// The relay listener pods' relays dial (`[relay]`, off by default).
    pub relay: crate::relay::RelaySettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            data_dir: PathBuf::from("data"),
            instance_id: None,
            database_file: PathBuf::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            public_url: "http://127.0.0.1:8080".into(),
            policy_file: PathBuf::from("policies/support.yaml"),
            agents_dir: PathBuf::from("agents"),
            skills_dir: PathBuf::from("skills"),
            default_agent: "support".into(),
            master_key_file: PathBuf::new(),
            master_key: None,
            audit_anchor_file: PathBuf::new(),
            plain: PlainSettings::default(),
            stripe: provider::default_stripe(),
            github: provider::default_github(),
            repo: RepoSettings::default(),
            sandbox: SandboxSettings::default(),
            sessions: SessionSettings::default(),
            model: crate::model::ModelSettings::default(),
            mcp: crate::mcp::McpSettings::default(),
            server: ServerSettings::default(),
            store: StoreSettings::default(),
            telemetry: TelemetrySettings::default(),
            review: Default::default(),
            relay: crate::relay::RelaySettings::default(),
        }
    }
}

impl Settings {
    /// The master key file: `master_key_file` when set, else `master.key` in
    /// `data_dir`.
    pub fn master_key_path(&self) -> PathBuf {
        if self.master_key_file.as_os_str().is_empty() {
            self.data_dir.join("master.key")
        } else {
            self.master_key_file.clone()
        }
    }

    /// The audit anchor file: `audit_anchor_file` when set, else `audit.anchor` in
    /// `data_dir`.
    pub fn audit_anchor_path(&self) -> PathBuf {
        if self.audit_anchor_file.as_os_str().is_empty() {
            self.data_dir.join("audit.anchor")
        } else {
            self.audit_anchor_file.clone()
        }
    }

    /// The SQLite database file (used when `[store] url` is empty): `database_file` when
    /// set, else `threadgate.db` in `data_dir`.
    pub fn database_path(&self) -> PathBuf {
        if self.database_file.as_os_str().is_empty() {
            self.data_dir.join("threadgate.db")
        } else {
            self.database_file.clone()
        }
    }

    /// The file keeping this data directory's generated instance id.
    pub fn instance_id_path(&self) -> PathBuf {
        self.data_dir.join("instance_id")
    }

    /// Opens the configured store: Postgres at `[store] url`, else the SQLite file.
    pub fn open_store(&self) -> Result<crate::store::Db, crate::store::StoreError> {
        crate::store::Db::open_configured(
            self.store.postgres_url(),
            self.store.pool_size,
            &self.database_path(),
        )
    }

    /// Where session worktrees are checked out.
    pub fn worktrees_dir(&self) -> PathBuf {
        self.data_dir.join("worktrees")
    }

    /// Where each session's socket directory lives.
    pub fn sockets_dir(&self) -> PathBuf {
        self.data_dir.join("sockets")
    }
}
