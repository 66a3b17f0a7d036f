//! The application: builds every part from [`Settings`] and runs them until shutdown.
//! `main` and the integration tests build it the same way (tests on port 0).

mod connector_setup;
mod metrics_http;

use crate::secrets::ExposeSecret as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{Notify, broadcast};

use crate::approvals::{self, Approvals};
use crate::config::Settings;
use crate::gateway::{ConnLimits, Gate, LoadedPolicy, SandboxApi, SandboxRouter, SocketHost};
use crate::model::{ModelProxy, Upstream};
use crate::policy::{Catalog, Policy};
use crate::sandbox::{DockerRuntime, Limits, SandboxRuntime};
use crate::secrets::{MasterKey, Redactor, RedactorSource, SecretStore};
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
    /// The reviewers' bounded password-hashing pool (its counters are observable).
    pub hasher: Arc<crate::approvals::hasher::Hasher>,
    pub supervisor: SupervisorHandle,
    pub instance_id: String,
    /// Turns `true` once the calls a previous run left behind have been recovered (an
    /// event tests wait on instead of sleeping).
    pub recovered: tokio::sync::watch::Receiver<bool>,
    /// Where `GET /metrics` is served, when `[telemetry] metrics_listen` is set.
    pub metrics_addr: Option<SocketAddr>,
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
            let path = settings.master_key_path();
            if !path.exists() {
                MasterKey::generate().write_to(&path)?;
                tracing::info!(path = %path.display(), "created a new master key");
            }
            MasterKey::from_file(&path)?
        }
    };
    Ok(SecretStore::new(db.clone(), Arc::new(key)))
}

/// The model proxy, with the upstream key read from the secrets store (it never
/// reaches a container).
async fn model_proxy(
    settings: &Settings,
    secrets: &SecretStore,
    gate: Arc<Gate>,
) -> anyhow::Result<Arc<ModelProxy>> {
    let key = secrets.get(&settings.model.key_secret).await.ok();
    if key.is_none() && settings.model.provider != crate::model::Provider::Scripted {
        tracing::warn!(secret = %settings.model.key_secret, "no model key stored; model calls will fail until it is set");
    }
    let upstream = Upstream::new(settings.model.clone(), key)?;
    Ok(Arc::new(ModelProxy::new(
        gate,
        settings.model.clone(),
        upstream,
    )))
}

/// The draft pull request publisher: only with a remote, a GitHub connector and a
/// configured repository (the first of `[github] repos`).
fn publisher(
    settings: &Settings,
    gate: &Arc<Gate>,
    db: &Db,
    base: String,
) -> Option<Arc<dyn crate::session::BranchPublisher>> {
    settings.repo.remote.as_ref()?;
    let github = gate.connectors.github.clone()?;
    let repo = settings.github.repos.first()?.clone();
    let g = gate.clone();
    Some(Arc::new(crate::session::GithubPublisher {
        github,
        repo,
        base,
        db: db.clone(),
        redactor: Arc::new(move || g.current_redactor()),
    }))
}

/// The running policy's file and hash, for `/readyz`.
fn policy_info(gate: &Arc<Gate>) -> crate::health::LoadedPolicyInfo {
    let gate = gate.clone();
    Arc::new(move || {
        let p = gate.current_policy();
        (std::path::PathBuf::from(&p.file), p.hash_hex.clone())
    })
}

/// Binds the metrics listener and serves `GET /metrics` on it in the background.
async fn serve_metrics(
    at: SocketAddr,
    db: &Db,
    clock: &Clock,
    limits: ConnLimits,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(at)
        .await
        .with_context(|| format!("cannot listen for metrics on {at}"))?;
    let addr = listener.local_addr()?;
    let router = metrics_http::router(metrics_http::MetricsState {
        db: db.clone(),
        clock: clock.clone(),
    });
    background.push(tokio::spawn(crate::gateway::serve::serve(
        listener,
        router,
        limits,
        std::future::pending(),
    )));
    Ok(addr)
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
        let generation = secrets.generation().await?;
        let redactor = Redactor::new(secrets.all_values().await?)?;
        let connectors = connector_setup::build(&settings, Arc::new(secrets.clone())).await?;
        // Refused here, at start, never at the first webhook.
        let agents = Arc::new(AgentBook::load_checked(
            &settings.agents_dir,
            &settings.skills_dir,
            &Catalog::builtin(),
            &settings.model,
        )?);
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
        let base_branch = workspaces
            .default_ref()
            .trim_start_matches("refs/heads/")
            .to_owned();
        let (changes, _) = broadcast::channel(1024);
        let gate = Arc::new(Gate {
            db: db.clone(),
            policy: RwLock::new(Arc::new(loaded)),
            catalog: Catalog::builtin(),
            connectors,
            redactor: RwLock::new(Arc::new(redactor)),
            redactor_source: Some(RedactorSource::new(secrets.clone(), Some(generation))),
            agents: agents.clone(),
            public_url: settings.public_url.clone(),
            clock: clock.clone(),
            changes,
            outbox: Notify::new(),
            supervisor: OnceLock::new(),
        });
        let approvals = Approvals::new(gate.clone());
        // Before the supervisor can open a session socket: only calls a previous run
        // left behind are recovered, never one a session makes now.
        let leftovers = approvals.leftovers().await;
        let limits = ConnLimits {
            max_connections: settings.server.max_connections,
            max_per_address: settings.server.max_connections_per_address,
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
            model: OnceLock::new(),
        });
        let _ = sandbox_api
            .calls
            .set(Arc::new(crate::mcp::CallsWithMcp::new(gate.clone())) as Arc<dyn SandboxRouter>);
        let model_proxy = model_proxy(&settings, &secrets, gate.clone()).await?;
        let _ = sandbox_api
            .model
            .set(Arc::new(model_proxy) as Arc<dyn SandboxRouter>);
        sockets.set_router(Arc::new(sandbox_api.clone()));
        let readiness = crate::health::Readiness {
            db: db.clone(),
            sandbox: sandbox.clone(),
            image: settings.sandbox.image.clone(),
            policy: policy_info(&gate),
            timeout: settings.telemetry.ready_timeout,
            clock: clock.clone(),
        };
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
            publisher: publisher(&settings, &gate, &db, base_branch),
            notes: Some(Arc::new(approvals::stop_note::OutboxStopNotes::new(
                gate.clone(),
            ))),
        });
        let _ = sandbox_api.supervisor.set(handle.clone());
        let _ = gate.supervisor.set(handle.clone());

        let (notify_tx, mut notify_rx) =
            tokio::sync::mpsc::unbounded_channel::<webhook::StoredEvent>();
        let intake_clock = clock.clone();
        let mut intake = webhook::IntakeConfig::new(webhook::SigningSecret::new(
            signing_secret.expose_secret().as_bytes().to_vec(),
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
            .merge(crate::health::router(readiness))
            .merge(intake_router)
            .merge(approvals::http::router(approvals.clone()))
            .merge(crate::review::router(crate::review::ReviewState::new(
                approvals.clone(),
                &settings.public_url,
                settings.plain.thread_url.clone(),
            )));

        let mut background = Vec::new();
        let sup = handle.clone();
        background.push(tokio::spawn(async move {
            while let Some(ev) = notify_rx.recv().await {
                sup.thread_changed(&ev.thread_id);
            }
        }));
        background.push(tokio::spawn(approvals::outbox::run(gate.clone())));
        background.push(tokio::spawn(crate::audit::anchor::keep(
            db.clone(),
            settings.audit_anchor_path(),
            Duration::from_secs(60),
        )));
        let a = approvals.clone();
        let (recovery_done, recovered) = tokio::sync::watch::channel(false);
        background.push(tokio::spawn(async move {
            a.recover(leftovers).await;
            let _ = recovery_done.send(true);
            loop {
                a.expire_due().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
        let g = gate.clone();
        background.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                g.refresh_redactor().await;
            }
        }));

        let metrics_addr = match settings.telemetry.metrics_listen {
            Some(at) => Some(serve_metrics(at, &db, &clock, limits, &mut background).await?),
            None => None,
        };
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
            hasher: approvals.hasher.clone(),
            supervisor: handle,
            instance_id,
            recovered,
            metrics_addr,
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
        let metrics = self
            .metrics_addr
            .map_or("off".to_owned(), |a| a.to_string());
        tracing::info!(addr = %self.addr, metrics = %metrics, instance = %self.instance_id, "threadgate serving");
        crate::gateway::serve::serve(self.listener, self.router, self.limits, shutdown).await;
        self.supervisor.shutdown();
        for task in self.background {
            task.abort();
        }
        drop(self.sockets);
        Ok(())
    }
}
