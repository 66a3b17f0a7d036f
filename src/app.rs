//! The application: builds every part from [`Settings`] and runs them until shutdown.
//! `main` and the integration tests build it the same way (tests on port 0).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{Notify, broadcast};

use crate::approvals::{self, Approvals};
use crate::config::Settings;
use crate::connectors::helpdesk::EscalationRouting;
use crate::connectors::{Credential, GithubConnector, HelpdeskConnector, StripeConnector};
use crate::gateway::{
    ConnLimits, Connectors, Gate, LoadedPolicy, SandboxApi, SandboxRouter, SocketHost,
};
use crate::policy::{Catalog, Policy};
use crate::sandbox::{DockerRuntime, Limits, SandboxRuntime};
use crate::secrets::{MasterKey, Redactor, SecretStore};
use crate::session::{AgentBook, Clock, SessionApi, Supervisor, SupervisorHandle, SupervisorParts};
use crate::store::Db;
use crate::webhook;

/// Parts a test may swap for its own (a fake sandbox, a fixed clock).
#[derive(Default)]
pub struct Overrides {
    pub sandbox: Option<Arc<dyn SandboxRuntime>>,
    pub clock: Option<Clock>,
}

/// A built threadgate, listening but not yet serving.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    pub addr: SocketAddr,
    pub db: Db,
    pub gate: Arc<Gate>,
    pub supervisor: SupervisorHandle,
    pub instance_id: String,
    limits: ConnLimits,
    sockets: Arc<SocketHost>,
    background: Vec<tokio::task::JoinHandle<()>>,
}

/// Reads the current instance id, creating one on first start.
async fn instance_id(db: &Db, configured: Option<&str>) -> anyhow::Result<String> {
    if let Some(id) = configured {
        return Ok(id.to_owned());
    }
    let fresh = format!("tg{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    // `build` runs inside the runtime: a blocking write would panic there.
    let id = db
        .write(move |c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('instance_id', ?1) ON CONFLICT (key) DO NOTHING",
                [&fresh],
            )?;
            c.query_row(
                "SELECT value FROM meta WHERE key = 'instance_id'",
                [],
                |r| r.get(0),
            )
        })
        .await?;
    Ok(id)
}

/// Creates the data directory if needed and opens the database in it.
pub fn open_db(settings: &Settings) -> anyhow::Result<Db> {
    std::fs::create_dir_all(&settings.data_dir).with_context(|| {
        format!(
            "cannot create data directory {}",
            settings.data_dir.display()
        )
    })?;
    // The data directory holds the database, the master key and the sockets: this
    // user's only.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&settings.data_dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot restrict {}", settings.data_dir.display()))?;
    Ok(Db::open(&settings.database_path())?)
}

/// Loads and compiles the policy file; errors carry file:line:column.
pub fn load_policy(path: &Path) -> anyhow::Result<LoadedPolicy> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    let name = path.display().to_string();
    let policy = Policy::parse(&text, &name).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(LoadedPolicy::new(policy, name))
}

/// Opens the secrets store, creating a master key file on first start when no key is
/// given through the environment.
pub fn open_secrets(db: &Db, settings: &Settings) -> anyhow::Result<SecretStore> {
    let key = match std::env::var("THREADGATE_MASTER_KEY") {
        Ok(_) => MasterKey::from_env("THREADGATE_MASTER_KEY")?,
        Err(_) => {
            if !settings.master_key_file.exists() {
                MasterKey::generate().write_to(&settings.master_key_file)?;
                tracing::info!(path = %settings.master_key_file.display(), "created a new master key");
            }
            MasterKey::from_file(&settings.master_key_file)?
        }
    };
    Ok(SecretStore::new(db.clone(), Arc::new(key)))
}

async fn connectors(settings: &Settings, secrets: &SecretStore) -> anyhow::Result<Connectors> {
    let get = |name: String| async move { secrets.get(&name).await.ok() };
    let mut c = Connectors::default();
    if let Some(key) = get(settings.stripe.key_secret.clone()).await {
        c.stripe = Some(Arc::new(StripeConnector::new(
            &settings.stripe.api_url,
            Credential::new(key.expose()),
        )?));
    }
    if let Some(key) = get(settings.plain.api_key_secret.clone()).await {
        let mut h = HelpdeskConnector::new(&settings.plain.api_url, Credential::new(key.expose()))?;
        if let Some(label) = &settings.plain.escalation_label_type_id {
            h = h.with_escalation(EscalationRouting {
                label_type_ids: vec![label.clone()],
                assign_to_user_id: None,
                use_escalation_path: false,
            });
        }
        c.helpdesk = Some(Arc::new(h));
    }
    if let Some(key) = get(settings.github.key_secret.clone()).await {
        c.github = Some(Arc::new(GithubConnector::new(
            &settings.github.api_url,
            Credential::new(key.expose()),
        )?));
    }
    Ok(c)
}

impl Application {
    /// Builds every part and binds the people's listener.
    pub async fn build(settings: Settings, overrides: Overrides) -> anyhow::Result<Application> {
        let signing_secret = settings.plain.signing_secret.clone().context(
            "refusing to start without a Plain signing secret: set THREADGATE_PLAIN_SIGNING_SECRET \
             (or plain.signing_secret_file); an unsigned webhook endpoint would let anyone open sessions",
        )?;
        match crate::gateway::raise_open_file_limit() {
            Ok(n) => tracing::debug!(open_files = n, "open-file limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        }
        let db = open_db(&settings)?;
        let instance_id = instance_id(&db, settings.instance_id.as_deref()).await?;
        let loaded = load_policy(&settings.policy_file)?;
        let secrets = open_secrets(&db, &settings)?;
        let redactor = Redactor::new(secrets.all_values().await?)?;
        let agents = Arc::new(AgentBook::load(&settings.agents_dir, &settings.skills_dir)?);
        let clock: Clock = overrides
            .clock
            .unwrap_or_else(|| Arc::new(|| chrono::Utc::now().timestamp_millis()));
        let sandbox: Arc<dyn SandboxRuntime> = match overrides.sandbox {
            Some(s) => s,
            None => Arc::new(
                DockerRuntime::connect(&instance_id, settings.sandbox.secrets_root.clone()).await?,
            ),
        };
        let workspaces = crate::workspace::Workspaces::open(crate::workspace::RepoConfig {
            repo_path: settings.repo.path.clone(),
            default_branch: settings.repo.default_branch.clone(),
            worktrees_dir: settings.worktrees_dir(),
            remote: settings.repo.remote.clone(),
        })?;
        let (changes, _) = broadcast::channel(1024);
        let gate = Arc::new(Gate {
            db: db.clone(),
            policy: RwLock::new(Arc::new(loaded)),
            catalog: Catalog::builtin(),
            connectors: connectors(&settings, &secrets).await?,
            redactor: RwLock::new(Arc::new(redactor)),
            agents: agents.clone(),
            public_url: settings.public_url.clone(),
            clock: clock.clone(),
            changes,
            outbox: Notify::new(),
            supervisor: OnceLock::new(),
        });
        let approvals = Approvals { gate: gate.clone() };
        // Before the supervisor can open a session socket: only calls a previous run
        // left behind are recovered, never one a session makes now.
        let leftovers = approvals.leftovers().await;
        let limits = ConnLimits {
            max_connections: settings.server.max_connections,
            header_timeout: settings.server.header_timeout,
            body_timeout: settings.server.body_timeout,
        };
        let sockets = Arc::new(SocketHost::new().with_limits(ConnLimits {
            max_connections: settings.sessions.socket_max_connections,
            ..limits
        }));
        let sandbox_api = Arc::new(SandboxApi {
            db: db.clone(),
            agents: agents.clone(),
            supervisor: OnceLock::new(),
            calls: OnceLock::new(),
        });
        let _ = sandbox_api
            .calls
            .set(Arc::new(gate.clone()) as Arc<dyn SandboxRouter>);
        sockets.set_router(Arc::new(sandbox_api.clone()));
        let (handle, _task) = Supervisor::spawn(SupervisorParts {
            db: db.clone(),
            sandbox,
            workspaces: Arc::new(workspaces),
            api: sockets.clone() as Arc<dyn SessionApi>,
            agents: agents.clone(),
            secrets: Arc::new(secrets.clone()),
            image: settings.sandbox.image.clone(),
            limits: Limits {
                memory_bytes: settings.sandbox.memory_bytes.max(0) as u64,
                nano_cpus: settings.sandbox.nano_cpus.max(0) as u64,
                pids: settings.sandbox.pids.max(0) as u64,
            },
            sockets_dir: settings.sockets_dir(),
            settings: settings.sessions.clone(),
            default_agent: settings.default_agent.clone(),
            clock: clock.clone(),
        });
        let _ = sandbox_api.supervisor.set(handle.clone());
        let _ = gate.supervisor.set(handle.clone());

        let (notify_tx, mut notify_rx) =
            tokio::sync::mpsc::unbounded_channel::<webhook::StoredEvent>();
        let intake_clock = clock.clone();
        let mut intake = webhook::IntakeConfig::new(webhook::SigningSecret::new(
            signing_secret.expose().as_bytes().to_vec(),
        )?);
        intake.max_body_bytes = settings.plain.max_body_bytes;
        intake.max_skew = settings.plain.max_skew;
        let intake_router = webhook::router(webhook::IntakeState {
            db: db.clone(),
            config: intake,
            clock: intake_clock,
            notify: notify_tx,
        });
        let router = axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .merge(intake_router)
            .merge(approvals::http::router(approvals.clone()));

        let mut background = Vec::new();
        let sup = handle.clone();
        background.push(tokio::spawn(async move {
            while let Some(ev) = notify_rx.recv().await {
                sup.thread_changed(&ev.thread_id);
            }
        }));
        background.push(tokio::spawn(approvals::outbox::run(gate.clone())));
        let a = approvals.clone();
        background.push(tokio::spawn(async move {
            a.recover(leftovers).await;
            loop {
                a.expire_due().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
        let g = gate.clone();
        let refresh_store = secrets.clone();
        background.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                if let Ok(values) = refresh_store.all_values().await
                    && let Ok(redactor) = Redactor::new(values)
                {
                    *g.redactor.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(redactor);
                }
            }
        }));

        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let addr = listener.local_addr()?;
        Ok(Application {
            listener,
            router,
            addr,
            db,
            gate,
            supervisor: handle,
            instance_id,
            limits,
            sockets,
            background,
        })
    }

    /// Serves until `shutdown` resolves, then stops the background work. Containers keep
    /// running; the next start adopts them.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        tracing::info!(addr = %self.addr, instance = %self.instance_id, "threadgate serving");
        crate::gateway::serve::serve(self.listener, self.router, self.limits, shutdown).await;
        self.supervisor.shutdown();
        for task in self.background {
            task.abort();
        }
        drop(self.sockets);
        Ok(())
    }
}
