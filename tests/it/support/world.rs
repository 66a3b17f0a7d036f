//! The gateway's world: a temporary data directory and git repository, the repository's
//! policies, agents and skills, a [`FakeRuntime`] sandbox, and the providers pointed at
//! localstripe, the Plain fake and the GitHub stub. A session is opened the way Plain
//! opens one (a signed `thread.email_received` webhook) and driven the way an agent
//! drives it (HTTP/1.1 over the session's unix socket).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use threadgate::app::{self, Overrides};
use threadgate::config::Settings;
use threadgate::model::Provider;
use threadgate::model::scripted::ScriptedModel;
use threadgate::sandbox::FakeRuntime;
use threadgate::secrets::SecretString;
use threadgate::session::{SessionState, store as sessions};
use threadgate::store::Db;

use super::app::{TestApp, spawn_app};
use super::clock::TestClock;
use super::github_stub::{self, GithubStub};
use super::localstripe::LocalStripe;
use super::logs;
use super::plain::{email_received, plain_id, repo_root};
use super::plain_fake::{self, PlainFake};
use super::unix_http::unix_request;
use super::wait::{DEFAULT_WAIT, wait_for};

/// The Plain webhook signing secret of every gateway test app.
pub const SIGNING_SECRET: &str = "plain_whsec_e2e_gateway_5d81c0f2a4b7";
/// The Stripe key threadgate holds (localstripe accepts any `sk_` key). The fixtures
/// made directly on localstripe use another key.
pub const STRIPE_KEY: &str = "sk_test_e2e_gateway_9d2f71c3b8a54e06";
/// The one GitHub repository the test apps may reach.
pub const GITHUB_REPO: &str = "acme/billing";
/// Where approval links point.
pub const PUBLIC_URL: &str = "http://threadgate.reviewers.test";

/// Every stored secret value the apps hold, by name.
pub fn stored_secrets() -> Vec<(&'static str, &'static str)> {
    vec![
        ("stripe_api_key", STRIPE_KEY),
        ("plain_api_key", plain_fake::API_KEY),
        ("github_token", github_stub::TOKEN),
    ]
}

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
    /// Waits (up to [`DEFAULT_WAIT`]) for an internal note on `thread` whose text
    /// contains `needle` (an execution id, an approval link) and returns its text;
    /// panics naming `what` if none comes.
    pub async fn note_containing(&self, thread: &str, needle: &str, what: &str) -> String {
        let found = wait_for(DEFAULT_WAIT, || async {
            self.plain
                .thread(thread)
                .notes()
                .into_iter()
                .map(|(_, text)| text)
                .find(|text| text.contains(needle))
        })
        .await;
        found.unwrap_or_else(|| panic!("{what}: no note containing {needle} on {thread}"))
    }

    /// Stores `value` under `name` in the world's secrets store (before the app starts).
    pub async fn store_secret(&self, name: &str, value: &str) {
        let db = self.settings.open_store().expect("open the store");
        let secrets = app::open_secrets(&db, &self.settings).expect("open secrets");
        secrets
            .set(name, SecretString::from(value.to_owned()))
            .await
            .expect("set secret");
    }

    /// Keeps the app's state on the Postgres database at `url` (`[store] url`) instead
    /// of the SQLite file, with the stored secrets set there (before the app starts).
    pub async fn use_postgres(&mut self, url: &str) {
        self.settings.store.url = url.to_owned();
        for (name, value) in stored_secrets() {
            self.store_secret(name, value).await;
        }
    }

    /// Points the model proxy at a fresh scripted model server speaking `provider`'s
    /// wire format, with quick retries, and stores `key` as the model key.
    pub async fn use_scripted_model(&mut self, provider: Provider, key: &str) -> ScriptedModel {
        let model = ScriptedModel::start("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("the scripted model starts");
        let m = &mut self.settings.model;
        m.provider = provider;
        m.base_url = match provider {
            Provider::Anthropic => model.anthropic_base(),
            _ => model.openai_base(),
        };
        m.retry_base = Duration::from_millis(5);
        m.timeout = Duration::from_secs(10);
        self.store_secret("model_api_key", key).await;
        model
    }

    /// Configures Stripe's webhook endpoint with `signing_secret` (stored as
    /// `stripe_webhook_secret`), so the read scope remembers customer emails.
    pub async fn use_stripe_events(&mut self, signing_secret: &str) {
        self.settings.stripe.webhook_secret = Some("stripe_webhook_secret".into());
        self.store_secret("stripe_webhook_secret", signing_secret)
            .await;
    }

    /// Uses a copy of `agents/support.md` with these limits.
    pub fn limit_agent(&mut self, max_tokens: u64, max_turns: u64) {
        let dir = self.dir.path().join("agents");
        std::fs::create_dir_all(&dir).expect("agents dir");
        let text =
            std::fs::read_to_string(repo_root().join("agents/support.md")).expect("support.md");
        let text = text
            .replace("max_tokens: 200000", &format!("max_tokens: {max_tokens}"))
            .replace("max_turns: 40", &format!("max_turns: {max_turns}"));
        std::fs::write(dir.join("support.md"), text).expect("write agent");
        self.settings.agents_dir = dir;
    }

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
        logs::capture_logs();
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
        let settings = settings(&root, repo, policy_file, &stripe, &plain, &github);
        std::fs::create_dir_all(&settings.data_dir).expect("data dir");
        let db = Db::open(&settings.database_path()).expect("open db");
        let secrets = app::open_secrets(&db, &settings).expect("open secrets");
        for (name, value) in stored_secrets() {
            secrets
                .set(name, SecretString::from(value.to_owned()))
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

    /// A fresh bare repository in the test's directory (`remote.git`), to configure as
    /// `[repo] remote`.
    pub fn bare_remote(&self) -> PathBuf {
        let path = self.dir.path().join("remote.git");
        git2::Repository::init_bare(&path).expect("bare remote");
        path
    }

    /// Builds the real application on this world's data directory and serves it.
    pub async fn start(&self) -> TestApp {
        self.start_with(Overrides {
            sandbox: Some(self.sandbox.clone()),
            clock: None,
        })
        .await
    }

    /// As [`World::start`], on a clock the test moves ([`TestClock::advance`]).
    pub async fn start_with_clock(&self) -> (TestApp, TestClock) {
        let clock = TestClock::new();
        let app = self
            .start_with(Overrides {
                sandbox: Some(self.sandbox.clone()),
                clock: Some(clock.clock()),
            })
            .await;
        (app, clock)
    }

    /// A world under `policies/support.yaml` with its approvals' ttl set to `ttl`
    /// (e.g. `10m`).
    pub async fn with_approval_ttl(ttl: &str) -> World {
        let shipped =
            std::fs::read_to_string(repo_root().join("policies/support.yaml")).expect("policy");
        let policy = shipped.replace("ttl: 4h", &format!("ttl: {ttl}"));
        assert_ne!(policy, shipped, "the shipped policy's ttl line changed");
        World::with_policy_text(&policy).await
    }

    /// As [`World::start`] with `overrides` (`sandbox: None` runs real Docker).
    pub async fn start_with(&self, overrides: Overrides) -> TestApp {
        spawn_app(self.settings.clone(), overrides).await
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
        app: &TestApp,
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
    pub async fn session_of(&self, app: &TestApp, thread_id: &str) -> Session {
        let found = wait_for(Duration::from_secs(30), || async {
            let t = threadgate::ids::ThreadId::parse(thread_id).expect("thread id");
            let row = app
                .db
                .read(move |c| sessions::get(c, &t))
                .await
                .expect("read sessions")?;
            if row.state != SessionState::Running {
                return None;
            }
            let socket = self
                .settings
                .sockets_dir()
                .join(&row.session_id)
                .join("api.sock");
            let session = Session {
                id: row.session_id.to_string(),
                thread_id: thread_id.to_owned(),
                socket,
            };
            (session.get("/v1/agent").await.0 == 200).then_some(session)
        })
        .await;
        found.unwrap_or_else(|| panic!("the session of {thread_id} did not start"))
    }

    /// Creates a localstripe customer with `email` and one USD charge per amount, then
    /// opens a session on a new thread of that customer.
    pub async fn customer_session(&self, app: &TestApp, email: &str, charges: &[u64]) -> Customer {
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

/// The settings of a gateway world rooted at `root`.
fn settings(
    root: &Path,
    repo: PathBuf,
    policy_file: PathBuf,
    stripe: &LocalStripe,
    plain: &PlainFake,
    github: &GithubStub,
) -> Settings {
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
    settings.plain.signing_secret = Some(SecretString::from(SIGNING_SECRET.to_owned()));
    settings.plain.api_url = plain.base_url().to_owned();
    settings.stripe.api_url = stripe.base_url();
    settings.github.api_url = github.base_url().to_owned();
    settings.github.repos = vec![GITHUB_REPO.to_owned()];
    settings.repo.path = repo;
    settings.repo.default_branch = Some("main".into());
    settings.sandbox.secrets_root = root.join("secrets");
    // Workspace filesystems are tested on their own (sessions_docker).
    settings.sessions.workspace_bytes = 0;
    // Warm starts are tested on their own (sessions_docker_pool): no parked sandbox
    // among the containers these worlds count.
    settings.sessions.pool_size = 0;
    settings
}

/// A Stripe customer of the thread, with charges, and the thread's running session.
pub struct Customer {
    pub id: String,
    pub email: String,
    pub charges: Vec<String>,
    pub session: Session,
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

/// A running session and its socket, driven as its agent drives it.
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

    /// Asks for a refund the shipped policy holds (`requested_by_customer`) and returns
    /// the held execution's id; panics unless it is held (202).
    pub async fn hold_refund(&self, charge: &str, amount: u64) -> String {
        let args = json!({"charge": charge, "amount": amount, "reason": "requested_by_customer"});
        let (status, held) = self.call("stripe.create_refund", args, None).await;
        assert_eq!(status, 202, "{held}");
        held["execution_id"].as_str().expect("id").to_owned()
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

/// The stores a test that runs on both backends uses: SQLite always, and Postgres when
/// `THREADGATE_TEST_DATABASE_URL` names a server (the test database lives as long as
/// this value).
pub struct Backends {
    pg: Option<threadgate::store::testing::TestDb>,
}

impl Backends {
    pub fn from_env() -> Backends {
        Backends {
            pg: threadgate::store::testing::TestDb::postgres_from_env(),
        }
    }

    /// The backends' names, for [`Backends::world`] and assertion messages.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = vec!["sqlite"];
        if self.pg.is_some() {
            names.push("postgres");
        }
        names
    }

    /// A world under `policy` whose app keeps its state on `backend`.
    pub async fn world(&self, backend: &str, policy: &str) -> World {
        let mut world = World::with_policy_text(policy).await;
        if backend == "postgres" {
            let pg = self.pg.as_ref().expect("postgres is one of the names");
            world.use_postgres(pg.url().expect("a postgres url")).await;
        }
        world
    }
}

/// A policy under which refunds and Stripe reads run without a person: a write that
/// runs at once, for the tests of a write's path and `benches/gateway_call.rs`.
pub const REFUNDS_RUN_POLICY: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.create_refund"
    action: always_run
  - match: "stripe.get_*"
    action: always_run
"#;

/// Every refund localstripe holds (oldest first).
pub async fn refunds(stripe: &LocalStripe) -> Vec<Value> {
    stripe.get("refunds?limit=100").await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A policy under which reads of a customer's charges (`stripe.list_charges`) run, each
/// reserving its `limit` argument against a per-customer total of at most `max` a day:
/// such a read is decided on the write path, its decision committed before it runs.
pub fn limited_reads_policy(max: u64) -> String {
    format!(
        r#"
policy:
  default_mode: risk
policies:
{}"#,
        limited_reads_rule(max)
    )
}

/// [`limited_reads_policy`]'s one rule, as an entry of a policy's `policies` list.
pub fn limited_reads_rule(max: u64) -> String {
    format!(
        r#"  - match: "stripe.list_charges"
    action: always_run
    limits:
      - sum: limit
        per: customer
        window: 24h
        max: {max}
"#
    )
}
