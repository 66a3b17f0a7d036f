//! Helpers for the end-to-end session tests: one [`World`] per test (a temp git repo, a
//! data directory, a unique instance id, a secrets root on `/dev/shm`), a
//! [`spawn_app`] that builds the real [`Application`] with the real Docker runtime on
//! port 0, Plain's example payloads with fresh ids and timestamps, signed like Plain
//! signs them, and the `docker` CLI to look at what really runs.
//!
//! Each app runs on its own tokio runtime, so that a test can simulate a crash by
//! shutting that runtime down: every task of threadgate stops at once, while the
//! containers (and the database file) stay, as after a real crash.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use git2::{Oid, Repository, Signature};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use tempfile::TempDir;
use threadgate::app::{Application, Overrides};
use threadgate::config::{PlainSettings, RepoSettings, SandboxSettings, SessionSettings, Settings};
use threadgate::sandbox::{LABEL_INSTANCE, SandboxRuntime};
use threadgate::secrets::{MasterKey, SecretStore, SecretString};
use threadgate::session::SupervisorHandle;
use threadgate::store::Db;

/// The image sessions run in (built by `scripts/build-sandbox-image.sh`).
pub const IMAGE: &str = "threadgate-sandbox:latest";

/// What a test may change about the app it spawns.
#[derive(Clone)]
pub struct AppOptions {
    pub listen: SocketAddr,
    pub max_live: usize,
    /// How long a quiet session keeps its container.
    pub idle_timeout: Duration,
    /// The directory agent definitions are read from (the repository's `agents/` when
    /// `None`).
    pub agents_dir: Option<PathBuf>,
    /// Replaces the real Docker runtime (the burst benchmark's fake).
    pub sandbox: Option<Arc<dyn SandboxRuntime>>,
    /// Size of each session's workspace filesystem (0: unlimited).
    pub workspace_bytes: u64,
    /// Free space the data disk keeps for the database.
    pub disk_reserve_bytes: u64,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_live: 8,
            idle_timeout: Duration::from_secs(600),
            agents_dir: None,
            sandbox: None,
            workspace_bytes: 64 << 20,
            disk_reserve_bytes: 0,
        }
    }
}

/// One test's world. Dropping it force-removes every container labelled with its
/// instance id (even when the test failed) and its secrets root.
pub struct World {
    pub root: TempDir,
    pub instance: String,
    pub secrets_root: PathBuf,
    pub signing_secret: String,
}

impl World {
    /// A fresh repository (`main` with two files, a branch `other` and a tag `v1`), an
    /// empty data directory and a unique instance id.
    pub fn new() -> World {
        require_image();
        let root = tempfile::tempdir().expect("tempdir");
        let instance = format!("e2e{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        init_repo(&root.path().join("repo"));
        World {
            secrets_root: PathBuf::from(format!("/dev/shm/threadgate-{instance}")),
            root,
            instance,
            signing_secret: format!("whsec_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    pub fn repo_path(&self) -> PathBuf {
        self.root.path().join("repo")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    pub fn repo(&self) -> Repository {
        Repository::open(self.repo_path()).expect("open test repo")
    }

    /// Every ref of the repository with its target (symbolic refs by name).
    pub fn refs(&self) -> Vec<(String, String)> {
        all_refs(&self.repo())
    }

    // Field by field reads better than one literal for a struct this large.
    #[allow(clippy::field_reassign_with_default)]
    pub fn settings(&self, opts: &AppOptions) -> Settings {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let data_dir = self.data_dir();
        let defaults = Settings::default();
        Settings {
            master_key_file: data_dir.join("master.key"),
            data_dir,
            instance_id: Some(self.instance.clone()),
            listen: opts.listen,
            policy_file: crate_dir.join("policies/support.yaml"),
            agents_dir: opts
                .agents_dir
                .clone()
                .unwrap_or_else(|| crate_dir.join("agents")),
            skills_dir: crate_dir.join("skills"),
            plain: PlainSettings {
                signing_secret: Some(SecretString::from(self.signing_secret.clone())),
                ..defaults.plain
            },
            repo: RepoSettings {
                path: self.repo_path(),
                default_branch: Some("main".into()),
                remote: None,
            },
            sandbox: SandboxSettings {
                image: IMAGE.into(),
                memory_bytes: 256 << 20,
                nano_cpus: 500_000_000,
                pids: 128,
                secrets_root: self.secrets_root.clone(),
            },
            sessions: SessionSettings {
                max_live: opts.max_live,
                idle_timeout: opts.idle_timeout,
                reconcile_every: Duration::from_secs(1),
                workspace_bytes: opts.workspace_bytes,
                disk_reserve_bytes: opts.disk_reserve_bytes,
                ..SessionSettings::default()
            },
            ..defaults
        }
    }

    /// Stores `value` as secret `name` granted to `agent`, in the data directory the app
    /// will open (creating its master key), before the app is built.
    pub async fn grant_secret(&self, name: &str, value: &str, agent: &str) {
        let data_dir = self.data_dir();
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let key_file = data_dir.join("master.key");
        MasterKey::generate()
            .write_to(&key_file)
            .expect("write master key");
        let db = Db::open(&data_dir.join("threadgate.db")).expect("open db");
        let key = MasterKey::from_file(&key_file).expect("read master key");
        let store = SecretStore::new(db, Arc::new(key));
        store
            .set(name, SecretString::from(value.to_owned()))
            .await
            .expect("set secret");
        store.grant(name, agent).await.expect("grant secret");
    }

    /// Every container labelled with this world's instance id, inspected.
    pub fn containers(&self) -> Vec<Container> {
        containers_of(&self.instance)
    }

    /// Signs and posts a body to the app's webhook endpoint.
    pub async fn deliver(&self, app: &TestApp, body: &[u8]) -> (u16, Value) {
        let signature = sign(self.signing_secret.as_bytes(), body);
        let response = app
            .client
            .post(format!("http://{}/webhooks/plain", app.addr))
            .header("content-type", "application/json")
            .header("Plain-Request-Signature", signature)
            .body(body.to_vec())
            .send()
            .await
            .expect("post webhook");
        let status = response.status().as_u16();
        let json = response.json().await.unwrap_or(Value::Null);
        (status, json)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        remove_instance_containers(&self.instance);
        let _ = std::fs::remove_dir_all(&self.secrets_root);
        // Workspace filesystems of sessions the test left running.
        let worktrees = self.data_dir().join("worktrees");
        if let Ok(entries) = std::fs::read_dir(&worktrees) {
            for entry in entries.flatten() {
                let _ = threadgate::workspace::volume::unmount(&entry.path());
            }
        }
    }
}

/// A running threadgate on its own runtime.
pub struct TestApp {
    pub addr: SocketAddr,
    pub db: Db,
    pub supervisor: SupervisorHandle,
    pub client: reqwest::Client,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TestApp {
    /// Kills the app as a crash would: every task stops, nothing is shut down cleanly.
    pub fn crash(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    /// The session row of a thread: `(state, container_id, session_id)`.
    pub async fn session(&self, thread: &str) -> Option<(String, Option<String>, String)> {
        let thread = thread.to_owned();
        self.db
            .read(move |c| {
                use threadgate::store::rusqlite::OptionalExtension;
                c.query_row(
                    "SELECT state, container_id, session_id FROM sessions WHERE thread_id = ?1",
                    [&thread],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
            })
            .await
            .expect("read session")
    }

    /// Every session: `(thread, state, container_id, session_id)`.
    pub async fn sessions(&self) -> Vec<(String, String, Option<String>, String)> {
        self.db
            .read(|c| {
                let mut stmt = c.prepare(
                    "SELECT thread_id, state, container_id, session_id FROM sessions \
                     ORDER BY thread_id",
                )?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
                rows.collect()
            })
            .await
            .expect("read sessions")
    }

    /// The texts of the internal notes queued for a thread, oldest first.
    pub async fn notes(&self, thread: &str) -> Vec<String> {
        let thread = thread.to_owned();
        self.db
            .read(move |c| {
                let mut stmt =
                    c.prepare("SELECT text FROM note_outbox WHERE thread_id = ?1 ORDER BY rowid")?;
                let rows = stmt.query_map([&thread], |r| r.get(0))?;
                rows.collect()
            })
            .await
            .expect("read notes")
    }

    /// How many stored events carry `event_id`.
    pub async fn event_rows(&self, event_id: &str) -> i64 {
        let id = event_id.to_owned();
        self.db
            .read(move |c| {
                c.query_row(
                    "SELECT count(*) FROM events WHERE event_id = ?1",
                    [&id],
                    |r| r.get(0),
                )
            })
            .await
            .expect("count events")
    }

    /// Waits until the thread's session is running and returns its container id.
    pub async fn running(&self, thread: &str) -> String {
        let found = eventually(Duration::from_secs(60), || async {
            match self.session(thread).await {
                Some((state, Some(container), _)) if state == "running" => Some(container),
                _ => None,
            }
        })
        .await;
        match found {
            Some(container) => container,
            None => panic!(
                "session of {thread} not running after 60 s: {:?}",
                self.session(thread).await
            ),
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Builds the real application for `world` (real Docker unless `opts.sandbox` says
/// otherwise) on its own runtime and serves it.
pub async fn spawn_app(world: &World, opts: AppOptions) -> TestApp {
    // `RUST_LOG=threadgate=info` shows what the app did; silent otherwise.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_test_writer()
        .try_init();
    let settings = world.settings(&opts);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("threadgate-app")
        .enable_all()
        .build()
        .expect("app runtime");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let overrides = Overrides {
        sandbox: opts.sandbox.clone(),
        clock: None,
    };
    runtime.spawn(async move {
        match Application::build(settings, overrides).await {
            Ok(app) => {
                let parts = (app.addr, app.db.clone(), app.supervisor.clone());
                let _ = tx.send(Ok(parts));
                let _ = app.run_until(std::future::pending()).await;
            }
            Err(e) => {
                let _ = tx.send(Err(format!("{e:#}")));
            }
        }
    });
    let (addr, db, supervisor) = rx
        .await
        .expect("app task")
        .unwrap_or_else(|e| panic!("cannot build the application: {e}"));
    let addr = if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    };
    TestApp {
        addr,
        db,
        supervisor,
        client: reqwest::Client::new(),
        runtime: Some(runtime),
    }
}

/// Polls `probe` every 100 ms until it returns `Some` or `timeout` passes.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------
// Plain payloads

/// A fresh thread id shaped like Plain's (`th_` + 26 upper-case alphanumerics).
pub fn thread_id() -> String {
    format!(
        "th_{}",
        &uuid::Uuid::new_v4().simple().to_string().to_uppercase()[..26]
    )
}

/// A fresh event id shaped like Plain's.
pub fn event_id() -> String {
    format!(
        "pEv_{}",
        &uuid::Uuid::new_v4().simple().to_string().to_uppercase()[..26]
    )
}

fn shared_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("THREADGATE_SHARED") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared"))
        .find(|shared| shared.join("plain/examples").is_dir())
        .expect("shared/plain/examples not found: set THREADGATE_SHARED")
}

/// One of Plain's example deliveries (`thread-created.json`, `email-received.json`,
/// `thread-status-transitioned.json`) re-aimed at `thread` with a new event id, the
/// event at `at` and the delivery attempt now.
pub fn plain_event(example: &str, thread: &str, event: &str, at: DateTime<Utc>) -> Value {
    let path = shared_dir().join("plain/examples").join(example);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut body: Value = serde_json::from_str(&text).expect("example is JSON");
    body["id"] = Value::from(event);
    body["timestamp"] = Value::from(rfc3339(at));
    body["payload"]["thread"]["id"] = Value::from(thread);
    body["webhookMetadata"]["webhookDeliveryAttemptId"] =
        Value::from(format!("whAttempt_{}", uuid::Uuid::new_v4().simple()));
    body["webhookMetadata"]["webhookDeliveryAttemptNumber"] = Value::from(1);
    body["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = Value::from(rfc3339(Utc::now()));
    body
}

/// A retry of `body` as Plain sends it: same event id, a new attempt (id, number,
/// timestamp), so a new body and a new signature.
pub fn retry_of(body: &Value) -> Value {
    let mut retry = body.clone();
    let meta = &mut retry["webhookMetadata"];
    meta["webhookDeliveryAttemptId"] =
        Value::from(format!("whAttempt_{}", uuid::Uuid::new_v4().simple()));
    meta["webhookDeliveryAttemptNumber"] = Value::from(2);
    meta["webhookDeliveryAttemptTimestamp"] =
        Value::from(rfc3339(Utc::now() + chrono::Duration::milliseconds(7)));
    retry
}

pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Plain's signature: lowercase hex HMAC-SHA256 of the raw body.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac key");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

// ---------------------------------------------------------------------------------
// Docker, through its CLI

/// One container as `docker inspect` shows it.
#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    pub running: bool,
    pub inspect: Value,
}

impl Container {
    pub fn label(&self, name: &str) -> Option<String> {
        self.inspect["Config"]["Labels"][name]
            .as_str()
            .map(str::to_owned)
    }
}

fn require_image() {
    let out = Command::new("docker")
        .args(["image", "inspect", IMAGE])
        .output()
        .expect("docker CLI: run scripts/docker-up.sh");
    assert!(
        out.status.success(),
        "image {IMAGE} is missing: run scripts/build-sandbox-image.sh first"
    );
}

/// Runs `docker ARGS`, returning (exit code, stdout, stderr).
pub fn docker(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a bash script in a container as its own user.
pub fn exec(container: &str, script: &str) -> (i32, String, String) {
    docker(&["exec", container, "bash", "-c", script])
}

/// `docker inspect` of a container, as JSON.
pub fn inspect(container: &str) -> Value {
    let (code, out, err) = docker(&["inspect", container]);
    assert_eq!(code, 0, "docker inspect {container}: {err}");
    let list: Value = serde_json::from_str(&out).expect("inspect json");
    list[0].clone()
}

pub fn containers_of(instance: &str) -> Vec<Container> {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let (code, out, err) = docker(&["ps", "-aq", "--no-trunc", "--filter", &filter]);
    assert_eq!(code, 0, "docker ps: {err}");
    out.split_whitespace()
        .filter_map(|id| {
            // A container removed between `ps` and `inspect` is simply gone.
            let (code, out, _) = docker(&["inspect", id]);
            if code != 0 {
                return None;
            }
            let list: Value = serde_json::from_str(&out).ok()?;
            let inspect = list[0].clone();
            Some(Container {
                id: id.to_owned(),
                running: inspect["State"]["Running"].as_bool() == Some(true),
                inspect,
            })
        })
        .collect()
}

fn remove_instance_containers(instance: &str) {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let (_, out, _) = docker(&["ps", "-aq", "--filter", &filter]);
    let ids: Vec<&str> = out.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f"];
        args.extend(ids);
        let _ = docker(&args);
    }
}

// ---------------------------------------------------------------------------------
// git

fn init_repo(path: &Path) {
    let mut opts = git2::RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(path, &opts).expect("init repo");
    std::fs::write(path.join("README.md"), "# Service\n\nThe product's code.\n").expect("write");
    std::fs::create_dir_all(path.join("src")).expect("mkdir");
    std::fs::write(path.join("src/logs.rs"), "pub fn tail() {}\n").expect("write");
    let mut index = repo.index().expect("index");
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .expect("add");
    index.write().expect("write index");
    let tree = repo
        .find_tree(index.write_tree().expect("tree"))
        .expect("find tree");
    let sig = Signature::now("Maintainer", "maintainer@example.com").expect("sig");
    let commit = repo
        .commit(Some("HEAD"), &sig, &sig, "initial", &tree, &[])
        .expect("commit");
    let commit = repo.find_commit(commit).expect("find commit");
    repo.branch("other", &commit, false).expect("branch other");
    repo.tag_lightweight("v1", commit.as_object(), false)
        .expect("tag");
}

pub fn all_refs(repo: &Repository) -> Vec<(String, String)> {
    let mut refs: Vec<(String, String)> = repo
        .references()
        .expect("refs")
        .filter_map(Result::ok)
        .map(|r| {
            let name = r.name().map(str::to_owned).unwrap_or_default();
            let target = r
                .target()
                .map(|o| o.to_string())
                .or_else(|| r.symbolic_target().ok().flatten().map(str::to_owned))
                .unwrap_or_default();
            (name, target)
        })
        .collect();
    refs.sort();
    refs
}

pub fn branch_tip(repo: &Repository, branch: &str) -> Option<Oid> {
    repo.find_reference(&format!("refs/heads/{branch}"))
        .ok()
        .and_then(|r| r.target())
}
