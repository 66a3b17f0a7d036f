//! The harness of the gateway end-to-end tests: a real [`Application`] on 127.0.0.1:0
//! with a temporary data directory and git repository, the repository's policies,
//! agents and skills, a [`FakeRuntime`] sandbox, and its providers pointed at
//! localstripe, the Plain fake and the GitHub stub. A session is opened the way Plain
//! opens one (a signed `thread.email_received` webhook) and driven the way an agent
//! drives it (HTTP/1.1 over the session's unix socket).
//!
//! Shared with `benches/gateway_call.rs`, whose crate root declares the same
//! `localstripe`, `plain_fake` and `github_stub` modules.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;
use threadgate::app::{self, Application, Overrides};
use threadgate::config::Settings;
use threadgate::gateway::Gate;
use threadgate::sandbox::FakeRuntime;
use threadgate::secrets::SecretString;
use threadgate::session::{SessionState, store as sessions};
use threadgate::store::{Db, rusqlite};
use tokio::sync::oneshot;

use crate::github_stub::{self, GithubStub};
use crate::localstripe::LocalStripe;
use crate::plain_fake::{self, PlainFake};
pub use crate::unix_http::unix_request;

/// The Plain webhook signing secret of every test app.
pub const SIGNING_SECRET: &str = "plain_whsec_e2e_gateway_5d81c0f2a4b7";
/// The Stripe key threadgate holds (localstripe accepts any `sk_` key). The fixtures
/// made directly on localstripe use another key.
pub const STRIPE_KEY: &str = "sk_test_e2e_gateway_9d2f71c3b8a54e06";
/// The one GitHub repository the test apps may reach.
pub const GITHUB_REPO: &str = "acme/billing";
/// Where approval links point.
pub const PUBLIC_URL: &str = "http://threadgate.reviewers.test";

/// The repository root (policies, agents, skills).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every stored secret value the apps hold, by name.
pub fn stored_secrets() -> Vec<(&'static str, &'static str)> {
    vec![
        ("stripe_api_key", STRIPE_KEY),
        ("plain_api_key", plain_fake::API_KEY),
        ("github_token", github_stub::TOKEN),
    ]
}

// ---------------------------------------------------------------------------------
// Captured logs

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once per process) a subscriber that writes every event at debug level and
/// above, from every crate, into a buffer the tests can search.
pub fn capture_logs() {
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_ansi(false)
            .with_writer(move || LogSink(sink.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buffer
    });
}

/// Everything logged so far in this process.
pub fn captured_logs() -> Vec<u8> {
    LOGS.get()
        .map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------
// The world: peers, data directory, repository, settings

/// The peers and directories one test's threadgate runs against.
pub struct World {
    pub dir: TempDir,
    pub stripe: LocalStripe,
    pub plain: PlainFake,
    pub github: GithubStub,
    pub sandbox: Arc<FakeRuntime>,
    pub settings: Settings,
}

impl World {
    /// A world under `policies/support.yaml`.
    pub async fn new() -> World {
        World::with_policy(&repo_root().join("policies/support.yaml")).await
    }

    /// A world under a policy file holding `text`.
    pub async fn with_policy_text(text: &str) -> World {
        let file = tempfile::NamedTempFile::new().expect("policy file");
        std::fs::write(file.path(), text).expect("write policy");
        World::with_policy(file.path()).await
    }

    /// A world under a copy of `policy` (in the temp dir), with the stored secrets set.
    pub async fn with_policy(policy: &Path) -> World {
        capture_logs();
        let dir = TempDir::new().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical tempdir");
        let repo = root.join("repo");
        init_repo(&repo);
        let policy_file = root.join("policy.yaml");
        std::fs::copy(policy, &policy_file).expect("copy the policy");
        let stripe = tokio::task::spawn_blocking(LocalStripe::start)
            .await
            .expect("localstripe starts");
        let plain = PlainFake::start().await;
        let github = GithubStub::start().await;
        let mut settings = Settings {
            data_dir: root.join("data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            public_url: PUBLIC_URL.into(),
            policy_file,
            agents_dir: repo_root().join("agents"),
            skills_dir: repo_root().join("skills"),
            master_key_file: root.join("master.key"),
            ..Settings::default()
        };
        settings.plain.signing_secret = Some(SecretString::new(SIGNING_SECRET.to_owned()));
        settings.plain.api_url = plain.base_url().to_owned();
        settings.stripe.api_url = stripe.base_url();
        settings.github.api_url = github.base_url().to_owned();
        settings.github.repos = vec![GITHUB_REPO.to_owned()];
        settings.repo.path = repo;
        settings.repo.default_branch = Some("main".into());
        settings.sandbox.secrets_root = root.join("secrets");
        // Workspace filesystems are tested on their own (sessions_docker).
        settings.sessions.workspace_bytes = 0;
        std::fs::create_dir_all(&settings.data_dir).expect("data dir");
        let db = Db::open(&settings.database_path()).expect("open db");
        let secrets = app::open_secrets(&db, &settings).expect("open secrets");
        for (name, value) in stored_secrets() {
            secrets
                .set(name, SecretString::new(value.to_owned()))
                .await
                .expect("set secret");
        }
        drop(secrets);
        drop(db);
        World {
            dir,
            stripe,
            plain,
            github,
            sandbox: Arc::new(FakeRuntime::new()),
            settings,
        }
    }

    /// Builds the real application on this world's data directory and serves it.
    pub async fn start(&self) -> Running {
        self.start_with(Overrides {
            sandbox: Some(self.sandbox.clone()),
            clock: None,
        })
        .await
    }

    /// As [`World::start`] with `overrides` (`sandbox: None` runs real Docker).
    pub async fn start_with(&self, overrides: Overrides) -> Running {
        let app = Application::build(self.settings.clone(), overrides)
            .await
            .expect("the application builds");
        let (addr, db, gate) = (app.addr, app.db.clone(), app.gate.clone());
        let metrics_addr = app.metrics_addr;
        let hasher = app.hasher.clone();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run_until(async move {
            let _ = stopped.await;
        }));
        Running {
            addr,
            metrics_addr,
            db,
            gate,
            hasher,
            shutdown: Some(shutdown),
            task: Some(task),
            http: reqwest::Client::new(),
        }
    }

    /// The master key file's contents (a secret too).
    pub fn master_key_text(&self) -> String {
        std::fs::read_to_string(self.settings.master_key_path()).expect("master key")
    }

    /// Opens a session the way Plain does: the thread exists in Plain, then a signed
    /// `thread.email_received` webhook arrives. Waits until its container runs and its
    /// socket answers.
    pub async fn open_session(
        &self,
        app: &Running,
        thread_id: &str,
        customer_id: &str,
        email: &str,
    ) -> Session {
        self.plain.add_thread(thread_id, customer_id, email);
        let body = email_received(thread_id, customer_id, email);
        let status = app.send_webhook(&body).await;
        assert_eq!(status, 200, "the signed webhook is accepted");
        self.session_of(app, thread_id).await
    }

    /// The running session of `thread_id`, once its socket is up.
    pub async fn session_of(&self, app: &Running, thread_id: &str) -> Session {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let t = thread_id.to_owned();
            let row = app
                .db
                .read(move |c| sessions::get(c, &t))
                .await
                .expect("read sessions");
            if let Some(row) = row
                && row.state == SessionState::Running
            {
                let socket = self
                    .settings
                    .sockets_dir()
                    .join(&row.session_id)
                    .join("api.sock");
                let session = Session {
                    id: row.session_id,
                    thread_id: thread_id.to_owned(),
                    socket,
                };
                if session.get("/v1/agent").await.0 == 200 {
                    return session;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the session of {thread_id} did not start"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// A Stripe customer of the thread, with charges, and the thread's running session.
pub struct Customer {
    pub id: String,
    pub email: String,
    pub charges: Vec<String>,
    pub session: Session,
}

impl World {
    /// Creates a localstripe customer with `email` and one USD charge per amount, then
    /// opens a session on a new thread of that customer.
    pub async fn customer_session(&self, app: &Running, email: &str, charges: &[u64]) -> Customer {
        let id = self.stripe.create_customer(email).await;
        let mut made = Vec::new();
        for amount in charges {
            made.push(self.stripe.create_charge(&id, *amount, "usd").await);
        }
        let session = self
            .open_session(app, &plain_id("th"), &plain_id("c"), email)
            .await;
        Customer {
            id,
            email: email.to_owned(),
            charges: made,
            session,
        }
    }
}

/// A git repository with a `main` branch and one file.
fn init_repo(path: &Path) {
    let mut opts = git2::RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = git2::Repository::init_opts(path, &opts).expect("git init");
    let blob = repo.blob(b"# billing\n").expect("blob");
    let mut tree = repo.treebuilder(None).expect("treebuilder");
    tree.insert("README.md", blob, 0o100644).expect("insert");
    let tree = repo
        .find_tree(tree.write().expect("tree"))
        .expect("find tree");
    let sig = git2::Signature::now("test", "test@example.com").expect("signature");
    repo.commit(Some("refs/heads/main"), &sig, &sig, "first", &tree, &[])
        .expect("commit");
}

/// A `thread.email_received` delivery for `thread_id`, built from Plain's example with
/// a fresh event id and timestamps of now.
pub fn email_received(thread_id: &str, customer_id: &str, email: &str) -> Vec<u8> {
    let example = std::fs::read_to_string(shared_dir().join("plain/examples/email-received.json"))
        .expect("read the Plain example");
    let mut event: Value = serde_json::from_str(&example).expect("example json");
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    event["id"] = json!(format!("pEv_{}", uuid::Uuid::new_v4().simple()));
    event["timestamp"] = json!(now);
    event["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = json!(now);
    let thread = &mut event["payload"]["thread"];
    thread["id"] = json!(thread_id);
    thread["customer"]["id"] = json!(customer_id);
    thread["customer"]["email"]["email"] = json!(email);
    for actor in ["createdBy", "updatedBy", "statusChangedBy"] {
        thread[actor]["customerId"] = json!(customer_id);
    }
    let mail = &mut event["payload"]["email"];
    mail["from"]["email"] = json!(email);
    mail["from"]["emailActor"]["customerId"] = json!(customer_id);
    mail["createdBy"]["customerId"] = json!(customer_id);
    mail["textContent"] = json!("I was charged twice for my order.");
    serde_json::to_vec(&event).expect("serialize")
}

/// The hex HMAC-SHA256 of `body` under the signing secret, as Plain signs.
pub fn sign(body: &[u8]) -> String {
    threadgate::webhook::sign(SIGNING_SECRET.as_bytes(), body)
}

/// The shared directory (Plain's examples and test vectors).
pub fn shared_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("THREADGATE_SHARED") {
        return PathBuf::from(dir);
    }
    repo_root()
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared"))
        .find(|shared| shared.join("plain/examples").exists())
        .unwrap_or_else(|| repo_root().join("../shared"))
}

// ---------------------------------------------------------------------------------
// A running application

/// A served application; stopped by [`Running::stop`] (or, without waiting, on drop).
pub struct Running {
    pub addr: SocketAddr,
    /// The metrics listener, when the settings turn it on.
    pub metrics_addr: Option<SocketAddr>,
    pub db: Db,
    pub gate: Arc<Gate>,
    /// The reviewers' password-hashing pool of this application.
    pub hasher: Arc<threadgate::approvals::hasher::Hasher>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub http: reqwest::Client,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Running {
    /// Shuts the application down and waits until it has stopped serving.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        // For debugging a failure: `THREADGATE_E2E_LOGS=/tmp/e2e.log cargo test ...`.
        if let Some(path) = std::env::var_os("THREADGATE_E2E_LOGS") {
            let _ = std::fs::write(path, captured_logs());
        }
    }

    /// Posts a signed webhook; returns the status.
    pub async fn send_webhook(&self, body: &[u8]) -> u16 {
        self.http
            .post(format!("http://{}/webhooks/plain", self.addr))
            .header("Plain-Request-Signature", sign(body))
            .header("Content-Type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .expect("webhook request")
            .status()
            .as_u16()
    }

    /// A reviewer's decision: `POST /api/approvals/{id}` on the people's listener.
    pub async fn decide(
        &self,
        execution_id: &str,
        token: &str,
        decision: &str,
        message: &str,
    ) -> (u16, Value) {
        let response = self
            .http
            .post(format!("http://{}/api/approvals/{execution_id}", self.addr))
            .bearer_auth(token)
            .json(&json!({"decision": decision, "message": message}))
            .send()
            .await
            .expect("approval request");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    /// Creates a reviewer and returns its token.
    pub async fn add_reviewer(&self, name: &str) -> String {
        let created = threadgate::approvals::reviewers::add(&self.db, name)
            .await
            .expect("add reviewer");
        created.token.expose().to_owned()
    }

    /// Every execution, oldest first.
    pub async fn executions(&self) -> Vec<ExecRow> {
        self.db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT id, tool, status, verdict, because, args, result, error, summary, \
                     session_id, decision_message FROM executions ORDER BY created_at_ms, id",
                )?;
                let rows = stmt.query_map([], |r| {
                    Ok(ExecRow {
                        id: r.get(0)?,
                        tool: r.get(1)?,
                        status: r.get(2)?,
                        verdict: r.get(3)?,
                        because: r.get(4)?,
                        args: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or_default(),
                        result: r.get(6)?,
                        error: r.get(7)?,
                        summary: r.get(8)?,
                        session_id: r.get(9)?,
                        decision_message: r.get(10)?,
                    })
                })?;
                rows.collect()
            })
            .await
            .expect("read executions")
    }

    /// One execution by id.
    pub async fn execution(&self, id: &str) -> ExecRow {
        self.executions()
            .await
            .into_iter()
            .find(|e| e.id == id)
            .unwrap_or_else(|| panic!("no execution {id}"))
    }

    /// Every audit row as `(event, execution_id, rule, args_redacted, outcome)`.
    pub async fn audit_rows(&self) -> Vec<AuditRow> {
        self.db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT event, execution_id, rule, args_redacted, outcome, reviewer \
                     FROM audit ORDER BY id",
                )?;
                let rows = stmt.query_map([], |r| {
                    Ok(AuditRow {
                        event: r.get(0)?,
                        execution_id: r.get(1)?,
                        rule: r.get(2)?,
                        args: r.get(3)?,
                        outcome: r.get(4)?,
                        reviewer: r.get(5)?,
                    })
                })?;
                rows.collect()
            })
            .await
            .expect("read audit")
    }

    /// Checks the audit chain; returns its length.
    pub async fn verify_audit(&self) -> usize {
        let path = self.db.path().to_owned();
        tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(path).expect("open db");
            threadgate::audit::verify(&conn).expect("the audit chain verifies")
        })
        .await
        .expect("verify task")
    }
}

/// One row of the audit log, as the tests read it.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub event: String,
    pub execution_id: Option<String>,
    pub rule: Option<String>,
    pub args: Option<String>,
    pub outcome: Option<String>,
    pub reviewer: Option<String>,
}

/// One row of the executions table, as the tests read it.
#[derive(Debug, Clone)]
pub struct ExecRow {
    pub id: String,
    pub tool: String,
    pub status: String,
    pub verdict: String,
    pub because: String,
    pub args: Value,
    pub result: Option<String>,
    pub error: Option<String>,
    pub summary: Option<String>,
    pub session_id: String,
    pub decision_message: Option<String>,
}

// ---------------------------------------------------------------------------------
// A session, driven as its agent drives it

/// A running session and its socket.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub thread_id: String,
    pub socket: PathBuf,
}

impl Session {
    /// `POST /v1/calls`.
    pub async fn call(&self, tool: &str, args: Value, diagnosis: Option<&str>) -> (u16, Value) {
        let mut body = json!({"tool": tool, "args": args});
        if let Some(d) = diagnosis {
            body["diagnosis"] = json!(d);
        }
        unix_request(&self.socket, "POST", "/v1/calls", Some(&body)).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        unix_request(&self.socket, "GET", path, None).await
    }

    /// `GET /v1/executions/{id}/wait?timeout=S`.
    pub async fn wait(&self, execution_id: &str, timeout_s: u64) -> Value {
        let (status, body) = self
            .get(&format!(
                "/v1/executions/{execution_id}/wait?timeout={timeout_s}"
            ))
            .await;
        assert_eq!(status, 200, "wait answered {status}: {body}");
        body
    }
}

// ---------------------------------------------------------------------------------
// localstripe and Plain fake helpers

/// Every refund localstripe holds (oldest first).
pub async fn refunds(stripe: &LocalStripe) -> Vec<Value> {
    stripe.get("refunds?limit=100").await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until `check` holds, polling; panics with `what` after 20 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A unique Plain-shaped id with `prefix`.
pub fn plain_id(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        uuid::Uuid::new_v4().simple().to_string().to_uppercase()
    )
}
