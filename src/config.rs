//! Settings: one typed struct, read from an optional TOML file and then from
//! `THREADGATE_*` environment variables, with defaults that run on a fresh machine.
//!
//! Secret values (the Plain signing secret, the master key) are held in
//! [`crate::secrets::SecretString`] and never printed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::secrets::SecretString;
pub use crate::session::SessionSettings;

/// Errors while reading settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {name}: {message}")]
    Env { name: &'static str, message: String },
}

/// Everything threadgate reads at start.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Holds the database, worktrees and session sockets.
    pub data_dir: PathBuf,
    /// Names this instance on the containers it starts; generated once and kept in the
    /// database when empty.
    pub instance_id: Option<String>,
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
    #[serde(default = "default_stripe", deserialize_with = "provider::stripe")]
    pub stripe: ProviderSettings,
    /// The GitHub connector; a key left out of the table takes its default.
    #[serde(default = "default_github", deserialize_with = "provider::github")]
    pub github: ProviderSettings,
    pub repo: RepoSettings,
    pub sandbox: SandboxSettings,
    pub sessions: SessionSettings,
    /// The model proxy on the session socket (`[model]`).
    pub model: crate::model::ModelSettings,
    /// MCP on the session socket (`[mcp]`).
    pub mcp: crate::mcp::McpSettings,
    pub server: ServerSettings,
    /// Metrics, readiness and trace export (`[telemetry]`).
    pub telemetry: TelemetrySettings,
    /// The review page (`[review]`; `[review.oidc]`: sign-in through an OpenID provider).
    pub review: crate::review::oidc::ReviewSettings,
}

/// Metrics, readiness and trace export.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Where Prometheus metrics are served (`GET /metrics`); none (the default) serves
    /// none. Its own listener: never the people's listener, never a session socket.
    pub metrics_listen: Option<SocketAddr>,
    /// How long each `/readyz` check may take before it counts as failed.
    #[serde(with = "humantime_serde_compat")]
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
#[derive(Debug, Clone, Deserialize)]
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
    #[serde(with = "humantime_serde_compat")]
    pub header_timeout: Duration,
    /// Time a client has to send a request's body.
    #[serde(with = "humantime_serde_compat")]
    pub body_timeout: Duration,
    /// The longest a reviewer's name waits between sign-in attempts once it has had
    /// failures from anywhere (the per-name back-off; a name from one client address
    /// is locked separately).
    #[serde(with = "humantime_serde_compat")]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlainSettings {
    /// Set only through `THREADGATE_PLAIN_SIGNING_SECRET` or `signing_secret_file`.
    #[serde(skip)]
    pub signing_secret: Option<SecretString>,
    /// A file holding the webhook signing secret.
    pub signing_secret_file: Option<PathBuf>,
    #[serde(with = "humantime_serde_compat")]
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

/// A REST provider: where it is and which stored secret holds its credential. Read
/// from TOML through [`provider`], so each key left out takes the provider's default
/// (never an empty string).
#[derive(Debug, Clone, Default)]
pub struct ProviderSettings {
    /// The API's base URL.
    pub api_url: String,
    /// The name of the stored secret holding the credential.
    pub key_secret: String,
    /// GitHub only: the repositories (`owner/name`) the github tools may reach, and
    /// where a session's draft pull request is opened (the first). Empty: none.
    pub repos: Vec<String>,
    /// Stripe only: the name of the stored secret holding the signing secret of Stripe's
    /// webhook endpoint (`POST /webhooks/stripe`, events `customer.updated` and
    /// `customer.deleted`). When set, the read path's scope check remembers customer
    /// emails (those events forget them); unset, it asks Stripe on every read.
    pub webhook_secret: Option<String>,
    /// Stripe only: how long a remembered customer email is used at most, in case an
    /// event is lost (`15m` by default).
    pub email_max_age: Duration,
    /// Stripe only: the longest `Stripe-Signature` header and the most entries in it
    /// that `POST /webhooks/stripe` reads (`webhook_max_signature_bytes`, 1024, and
    /// `webhook_max_signature_entries`, 8); a longer one is refused before any MAC.
    pub signature_limits: crate::connectors::stripe::events::SignatureLimits,
    /// GitHub only: what becomes of a session's pull request when its thread is done
    /// (`draft`, the default: left as it is; `ready`: marked ready for review; `close`).
    pub on_done: crate::session::publish::OnDone,
}

/// The repository whose branches sessions work on.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepoSettings {
    pub path: PathBuf,
    pub default_branch: Option<String>,
    pub remote: Option<String>,
    /// New files one commit of a worktree may add; past it the rest are left out.
    pub max_commit_files: usize,
    /// New bytes of content one commit may add; past it the rest are left out.
    pub max_commit_bytes: u64,
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

/// The container every session runs in.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    pub image: String,
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
    /// A directory on a tmpfs where secret files are written for bind-mounting.
    pub secrets_root: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            data_dir: PathBuf::from("data"),
            instance_id: None,
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
            stripe: default_stripe(),
            github: default_github(),
            repo: RepoSettings::default(),
            sandbox: SandboxSettings::default(),
            sessions: SessionSettings::default(),
            model: crate::model::ModelSettings::default(),
            mcp: crate::mcp::McpSettings::default(),
            server: ServerSettings::default(),
            telemetry: TelemetrySettings::default(),
            review: Default::default(),
        }
    }
}

/// How long a remembered Stripe customer email is used at most.
const DEFAULT_EMAIL_MAX_AGE: Duration = Duration::from_secs(15 * 60);

fn default_stripe() -> ProviderSettings {
    ProviderSettings {
        api_url: "https://api.stripe.com".into(),
        key_secret: "stripe_api_key".into(),
        repos: Vec::new(),
        webhook_secret: None,
        email_max_age: DEFAULT_EMAIL_MAX_AGE,
        signature_limits: Default::default(),
        on_done: Default::default(),
    }
}

fn default_github() -> ProviderSettings {
    ProviderSettings {
        api_url: "https://api.github.com".into(),
        key_secret: "github_token".into(),
        repos: Vec::new(),
        webhook_secret: None,
        email_max_age: DEFAULT_EMAIL_MAX_AGE,
        signature_limits: Default::default(),
        on_done: Default::default(),
    }
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

impl Default for RepoSettings {
    fn default() -> Self {
        let limits = crate::workspace::CommitLimits::default();
        RepoSettings {
            path: PathBuf::from("."),
            default_branch: None,
            remote: None,
            max_commit_files: limits.max_files,
            max_commit_bytes: limits.max_bytes,
        }
    }
}

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            image: "threadgate-sandbox:latest".into(),
            memory_bytes: 1024 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            secrets_root: PathBuf::from("/dev/shm/threadgate"),
        }
    }
}

impl Settings {
    /// Reads `path` when given (or `threadgate.toml` when it exists), then applies the
    /// environment.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let default_path = Path::new("threadgate.toml");
        let file = match path {
            Some(p) => Some(p),
            None if default_path.exists() => Some(default_path),
            None => None,
        };
        let mut settings = match file {
            Some(p) => Self::from_file(p)?,
            None => Settings::default(),
        };
        settings.apply_env(|name| std::env::var(name).ok())?;
        settings.read_signing_secret_file()?;
        Ok(settings)
    }

    fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    /// Applies `THREADGATE_*` variables; `get` is the environment (a closure so tests
    /// need not touch the process's).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = get("THREADGATE_DATA_DIR") {
            self.data_dir = PathBuf::from(v);
        }
        if let Some(v) = get("THREADGATE_LISTEN") {
            self.listen = v.parse().map_err(|e| ConfigError::Env {
                name: "THREADGATE_LISTEN",
                message: format!("{e}: {v:?}"),
            })?;
        }
        if let Some(v) = get("THREADGATE_PUBLIC_URL") {
            self.public_url = v;
        }
        if let Some(v) = get("THREADGATE_POLICY") {
            self.policy_file = PathBuf::from(v);
        }
        if let Some(v) = get("THREADGATE_REPO") {
            self.repo.path = PathBuf::from(v);
        }
        if let Some(v) = get("THREADGATE_IMAGE") {
            self.sandbox.image = v;
        }
        if let Some(v) = get("THREADGATE_MASTER_KEY_FILE") {
            self.master_key_file = PathBuf::from(v);
        }
        if let Some(v) = get("THREADGATE_MASTER_KEY") {
            self.master_key = Some(SecretString::from(v));
        }
        if let Some(v) = get("THREADGATE_PLAIN_SIGNING_SECRET") {
            self.plain.signing_secret = Some(SecretString::from(v));
        }
        if let Some(v) = get("THREADGATE_METRICS_LISTEN") {
            self.telemetry.metrics_listen = match v.trim() {
                "" | "off" => None,
                addr => Some(addr.parse().map_err(|e| ConfigError::Env {
                    name: "THREADGATE_METRICS_LISTEN",
                    message: format!("{e}: {v:?}"),
                })?),
            };
        }
        if let Some(v) = get("THREADGATE_OTLP_ENDPOINT") {
            self.telemetry.otlp_endpoint = Some(v).filter(|v| !v.trim().is_empty());
        }
        if let Some(v) = get("THREADGATE_MAX_LIVE_SESSIONS") {
            self.sessions.max_live = v.parse().map_err(|e| ConfigError::Env {
                name: "THREADGATE_MAX_LIVE_SESSIONS",
                message: format!("{e}: {v:?}"),
            })?;
        }
        Ok(())
    }

    fn read_signing_secret_file(&mut self) -> Result<(), ConfigError> {
        if self.plain.signing_secret.is_some() {
            return Ok(());
        }
        let Some(path) = &self.plain.signing_secret_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        self.plain.signing_secret = Some(SecretString::from(text.trim().to_owned()));
        Ok(())
    }

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

    /// The SQLite database file.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("threadgate.db")
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

/// `[stripe]` and `[github]` tables: each key left out takes the provider's default.
mod provider {
    use serde::{Deserialize, Deserializer};

    use super::{ProviderSettings, default_github, default_stripe};
    use crate::connectors::stripe::events::SignatureLimits;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Partial {
        api_url: Option<String>,
        key_secret: Option<String>,
        repos: Option<Vec<String>>,
        webhook_secret: Option<String>,
        #[serde(default, with = "super::humantime_serde_compat::option")]
        email_max_age: Option<std::time::Duration>,
        webhook_max_signature_bytes: Option<usize>,
        webhook_max_signature_entries: Option<usize>,
        on_done: Option<crate::session::publish::OnDone>,
    }

    fn merge<'de, D: Deserializer<'de>>(
        d: D,
        defaults: ProviderSettings,
        stripe: bool,
    ) -> Result<ProviderSettings, D::Error> {
        let partial = Partial::deserialize(d)?;
        let limits = defaults.signature_limits;
        let signature_limits = SignatureLimits {
            max_bytes: partial
                .webhook_max_signature_bytes
                .unwrap_or(limits.max_bytes),
            max_entries: partial
                .webhook_max_signature_entries
                .unwrap_or(limits.max_entries),
        };
        let stripe_only = partial.webhook_secret.is_some()
            || partial.webhook_max_signature_bytes.is_some()
            || partial.webhook_max_signature_entries.is_some();
        if stripe_only && !stripe {
            return Err(serde::de::Error::custom(
                "webhook_secret and webhook_max_signature_* belong in [stripe], not [github]",
            ));
        }
        if partial.on_done.is_some() && stripe {
            return Err(serde::de::Error::custom(
                "on_done belongs in [github], not [stripe]",
            ));
        }
        Ok(ProviderSettings {
            api_url: partial.api_url.unwrap_or(defaults.api_url),
            key_secret: partial.key_secret.unwrap_or(defaults.key_secret),
            repos: partial.repos.unwrap_or(defaults.repos),
            webhook_secret: partial.webhook_secret.or(defaults.webhook_secret),
            email_max_age: partial.email_max_age.unwrap_or(defaults.email_max_age),
            signature_limits,
            on_done: partial.on_done.unwrap_or(defaults.on_done),
        })
    }

    pub fn stripe<'de, D: Deserializer<'de>>(d: D) -> Result<ProviderSettings, D::Error> {
        merge(d, default_stripe(), true)
    }

    pub fn github<'de, D: Deserializer<'de>>(d: D) -> Result<ProviderSettings, D::Error> {
        merge(d, default_github(), false)
    }
}

/// Durations written as `30m`, `4h`, `300s` in the TOML file.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }

    /// The same, for a key that may be left out.
    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer};

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let text = String::deserialize(d)?;
            humantime::parse_duration(&text)
                .map(Some)
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::ExposeSecret as _;

    #[test]
    fn a_file_and_the_environment_override_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\n[sessions]\nmax_live = 3\nidle_timeout = \"2m\"\nmax_pending_holds = 7\n",
        )
        .expect("write");
        let mut s = Settings::from_file(&path).expect("parse");
        assert_eq!(s.sessions.max_live, 3);
        assert_eq!(s.sessions.idle_timeout, Duration::from_secs(120));
        assert_eq!(s.sessions.max_pending_holds, 7);
        s.apply_env(|k| (k == "THREADGATE_MAX_LIVE_SESSIONS").then(|| "5".to_owned()))
            .expect("env");
        assert_eq!(s.sessions.max_live, 5);
        assert_eq!(s.listen.port(), 9000);
    }

    #[test]
    fn plain_state_labels_are_read_from_an_inline_table_and_a_misspelt_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "[plain]\nlabels = { waiting_for_approval = \"lt_w\", handed_to_person = \"lt_h\" }\n",
        )
        .expect("write");
        let s = Settings::from_file(&path).expect("parse");
        assert_eq!(
            s.plain.labels.configured(),
            [
                ("waiting_for_approval", "lt_w"),
                ("handed_to_person", "lt_h")
            ]
        );
        std::fs::write(&path, "[plain]\nlabels = { waiting = \"lt_w\" }\n").expect("write");
        let err = Settings::from_file(&path).expect_err("unknown label key");
        assert!(err.to_string().contains("waiting"), "{err}");
    }

    #[test]
    fn an_unknown_key_names_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "lisen = \"x\"\n").expect("write");
        let err = Settings::from_file(&path).expect_err("unknown key");
        let text = err.to_string();
        assert!(text.contains("t.toml") && text.contains("lisen"), "{text}");
    }

    #[test]
    fn a_provider_table_with_only_api_url_keeps_the_default_secret_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "[stripe]\napi_url = \"http://127.0.0.1:8420\"\n[github]\napi_url = \"http://127.0.0.1:1\"\n",
        )
        .expect("write");
        let s = Settings::from_file(&path).expect("parse");
        assert_eq!(s.stripe.api_url, "http://127.0.0.1:8420");
        assert_eq!(s.stripe.key_secret, "stripe_api_key");
        assert_eq!(s.github.api_url, "http://127.0.0.1:1");
        assert_eq!(s.github.key_secret, "github_token");
        std::fs::write(&path, "[github]\nkey_secret = \"gh\"\n").expect("write");
        let s = Settings::from_file(&path).expect("parse");
        assert_eq!(s.github.api_url, "https://api.github.com");
        assert_eq!(s.github.key_secret, "gh");
        assert_eq!(s.stripe.key_secret, "stripe_api_key");
        std::fs::write(&path, "[stripe]\napi_ur = \"x\"\n").expect("write");
        let err = Settings::from_file(&path).expect_err("unknown key");
        assert!(err.to_string().contains("api_ur"), "{err}");
    }

    #[test]
    fn the_stripe_signature_limits_and_the_sign_in_back_off_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        let s = Settings::default();
        assert_eq!(s.stripe.signature_limits.max_bytes, 1024);
        assert_eq!(s.stripe.signature_limits.max_entries, 8);
        assert_eq!(s.server.sign_in_backoff_max, Duration::from_secs(15));
        std::fs::write(
            &path,
            "[stripe]\nwebhook_max_signature_bytes = 300\nwebhook_max_signature_entries = 3\n\
             [server]\nsign_in_backoff_max = \"1m\"\n",
        )
        .expect("write");
        let s = Settings::from_file(&path).expect("parse");
        assert_eq!(s.stripe.signature_limits.max_bytes, 300);
        assert_eq!(s.stripe.signature_limits.max_entries, 3);
        assert_eq!(s.server.sign_in_backoff_max, Duration::from_secs(60));
        std::fs::write(&path, "[github]\nwebhook_max_signature_entries = 3\n").expect("write");
        let err = Settings::from_file(&path).expect_err("stripe only");
        assert!(err.to_string().contains("belong in [stripe]"), "{err}");
    }

    #[test]
    fn on_done_is_a_github_key_with_three_values() {
        use crate::session::publish::OnDone;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[github]\napi_url = \"http://127.0.0.1:1\"\n").expect("write");
        let s = Settings::from_file(&path).expect("parse");
        assert_eq!(s.github.on_done, OnDone::Draft);
        for (text, value) in [
            ("draft", OnDone::Draft),
            ("ready", OnDone::Ready),
            ("close", OnDone::Close),
        ] {
            std::fs::write(&path, format!("[github]\non_done = \"{text}\"\n")).expect("write");
            let s = Settings::from_file(&path).expect("parse");
            assert_eq!(s.github.on_done, value);
        }
        std::fs::write(&path, "[github]\non_done = \"merge\"\n").expect("write");
        let err = Settings::from_file(&path).expect_err("unknown value");
        assert!(err.to_string().contains("merge"), "{err}");
        std::fs::write(&path, "[stripe]\non_done = \"close\"\n").expect("write");
        let err = Settings::from_file(&path).expect_err("a github key");
        assert!(err.to_string().contains("on_done"), "{err}");
    }

    #[test]
    fn the_master_key_follows_data_dir_unless_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "data_dir = \"/srv/tg\"\n").expect("write");
        let mut s = Settings::from_file(&path).expect("parse");
        assert_eq!(s.master_key_path(), Path::new("/srv/tg/master.key"));
        s.apply_env(|k| (k == "THREADGATE_DATA_DIR").then(|| "/var/tg".to_owned()))
            .expect("env");
        assert_eq!(s.master_key_path(), Path::new("/var/tg/master.key"));
        std::fs::write(
            &path,
            "data_dir = \"/srv/tg\"\nmaster_key_file = \"/etc/tg.key\"\n",
        )
        .expect("write");
        let mut s = Settings::from_file(&path).expect("parse");
        s.apply_env(|k| (k == "THREADGATE_DATA_DIR").then(|| "/var/tg".to_owned()))
            .expect("env");
        assert_eq!(s.master_key_path(), Path::new("/etc/tg.key"));
    }

    #[test]
    fn metrics_are_off_unless_a_listen_address_is_set() {
        let mut s = Settings::default();
        assert_eq!(s.telemetry.metrics_listen, None);
        s.apply_env(|k| (k == "THREADGATE_METRICS_LISTEN").then(|| "127.0.0.1:9464".into()))
            .expect("env");
        assert_eq!(
            s.telemetry.metrics_listen,
            Some(([127, 0, 0, 1], 9464).into())
        );
        let err = s
            .apply_env(|k| (k == "THREADGATE_METRICS_LISTEN").then(|| "nine".into()))
            .expect_err("not an address");
        assert!(
            err.to_string().contains("THREADGATE_METRICS_LISTEN"),
            "{err}"
        );
        s.apply_env(|k| (k == "THREADGATE_METRICS_LISTEN").then(|| "off".into()))
            .expect("env");
        assert_eq!(s.telemetry.metrics_listen, None);
    }

    #[test]
    fn the_signing_secret_never_prints() {
        let mut s = Settings::default();
        s.apply_env(|k| (k == "THREADGATE_PLAIN_SIGNING_SECRET").then(|| "hunter2-xyz".into()))
            .expect("env");
        assert!(!format!("{s:?}").contains("hunter2-xyz"));
    }

    #[test]
    fn the_master_key_comes_through_the_settings_and_never_prints() {
        let mut s = Settings::default();
        assert!(s.master_key.is_none());
        s.apply_env(|k| (k == "THREADGATE_MASTER_KEY").then(|| "a2V5LXRleHQtc2VjcmV0".into()))
            .expect("env");
        let key = s.master_key.as_ref().expect("set from the environment");
        assert_eq!(key.expose_secret(), "a2V5LXRleHQtc2VjcmV0");
        assert!(!format!("{s:?}").contains("a2V5LXRleHQtc2VjcmV0"));
    }
}
