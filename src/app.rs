//! The application: builds every part from [`Settings`] and runs them until shutdown.
//! `main` and the integration tests build it the same way (tests on port 0).
//!
//! It owns every task it starts ([`Tasks`]): shutdown stops the listeners, then the
//! loops, then waits up to [`SHUTDOWN_DEADLINE`] for work in flight (an approved call
//! running, a container starting) and cuts what is left, as mini-redis does.

mod connector_setup;
mod instance;
mod metrics_http;

use crate::secrets::ExposeSecret as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::approvals::{self, Approvals};
use crate::clock::Clock;
use crate::config::Settings;
use crate::gateway::{
    Connectors, Gate, GateParts, LoadedPolicy, SandboxApi, SandboxRouter, SocketHost,
};
use crate::model::{ModelProxy, Upstream};
use crate::policy::{Catalog, Policy};
use crate::relay::{RelayCredentials, RelayParts};
use crate::reviewers::hasher::{GLOBAL_MAX_WAITING, GLOBAL_PERMITS, Hasher};
use crate::sandbox::k8s::{Backend, KubernetesSettings};
use crate::sandbox::{DockerRuntime, KubeRuntime, Limits, SandboxRuntime};
use crate::secrets::{
    KeySource, MasterKey, Redactor, RedactorSource, SealPurpose, SecretStore, SecretString,
};
use crate::server::ConnLimits;
use crate::session::{AgentBook, SessionApi, Supervisor, SupervisorHandle, SupervisorParts};
use crate::store::Db;
use crate::tasks::Tasks;
use crate::webhook;
use crate::workspace::{RepoConfig, Workspaces};

/// How long shutdown waits for work in flight before cutting it.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(20);

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
    pub hasher: Arc<Hasher>,
    pub supervisor: SupervisorHandle,
    pub instance_id: String,
    /// This boot's nonce in the instance registry (cleared at a clean stop).
    boot_nonce: String,
    /// This boot's heartbeat, renewed again while work in flight drains at shutdown.
    heartbeat: instance::Heartbeat,
    /// The data directory's lock, released when the application goes.
    _data_dir_lock: instance::DataDirLock,
    /// Turns `true` once the calls a previous run left behind have been recovered (an
    /// event tests wait on instead of sleeping).
    pub recovered: tokio::sync::watch::Receiver<bool>,
    /// Where `GET /metrics` is served, when `[telemetry] metrics_listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// Where pods' relays connect, when `[relay] listen` is set.
    pub relay_addr: Option<SocketAddr>,
    /// Mints the credential a session's relay presents (a backend whose sandboxes reach
    /// the gateway through the relay hands one to each at start).
    pub relay_credentials: Arc<RelayCredentials>,
    /// Every task the application started; drained at shutdown.
    pub tasks: Tasks,
    limits: ConnLimits,
    sockets: Arc<SocketHost>,
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
    Ok(settings.open_store()?)
}

/// Loads and compiles the policy file; errors carry file:line:column.
pub fn load_policy(path: &Path) -> anyhow::Result<LoadedPolicy> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    // Start-up errors name the whole path (the operator reads them); the loaded
    // policy carries only its name, which is what notes and answers show.
    let policy =
        Policy::parse(&text, &path.display().to_string()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(LoadedPolicy::new(policy, crate::gateway::policy_name(path)))
}

/// Opens the secrets store under the master key of the settings
/// (`THREADGATE_MASTER_KEY`), else of the key file, creating the file on first start.
pub fn open_secrets(db: &Db, settings: &Settings) -> anyhow::Result<SecretStore> {
    let key = match &settings.master_key {
        Some(text) => MasterKey::from_base64(
            text.expose_secret(),
            KeySource::Env("THREADGATE_MASTER_KEY".into()),
        )?,
        None => {
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

/// The model proxy, with the upstream key read from the secrets store at each call
/// (a key set after start is used by the next call; it never reaches a container).
async fn model_proxy(
    settings: &Settings,
    secrets: &SecretStore,
    gate: Arc<Gate>,
) -> anyhow::Result<Arc<ModelProxy>> {
    let stored = secrets.get(&settings.model.key_secret).await.is_ok();
    if !stored && settings.model.provider != crate::model::Provider::Scripted {
        tracing::warn!(secret = %settings.model.key_secret, "no model key stored; model calls fail until it is set");
    }
    let key =
        crate::connectors::Credential::live(&settings.model.key_secret, Arc::new(secrets.clone()));
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
    foundation: &Foundation,
    base: String,
) -> Option<Arc<dyn crate::session::BranchPublisher>> {
    settings.repo.remote.as_ref()?;
    let github = foundation.connectors.github.clone()?;
    let repo = settings.github.repos.first()?.clone();
    let (g, settled) = (gate.clone(), gate.clone());
    let notes = crate::notes::pull::OutboxPullNotes::new(gate.outbox().clone(), repo.clone());
    Some(Arc::new(crate::session::GithubPublisher {
        github,
        repo,
        base,
        db: foundation.db.clone(),
        redactor: Arc::new(move || g.current_redactor()),
        latest_finding: crate::executions::store::latest_finding,
        thread_calls: crate::executions::thread_calls::thread_calls,
        outcomes_settled: Arc::new(move |session| {
            let gate = settled.clone();
            Box::pin(async move { gate.session_outcomes_settled(session.as_str()).await })
        }),
        thread_cost: crate::model::store::thread_cost,
        notes: Arc::new(notes),
        on_done: settings.github.on_done,
    }))
}

/// What [`Application::build`] opens before wiring anything: the state, the policy,
/// the secrets, the agents and the runtimes.
struct Foundation {
    db: Db,
    instance_id: String,
    /// This boot's nonce in the instance registry.
    boot_nonce: String,
    /// The data directory's lock, held while the application lives.
    data_dir_lock: instance::DataDirLock,
    loaded: Arc<LoadedPolicy>,
    secrets: SecretStore,
    redactor: Arc<Redactor>,
    /// The secrets' generation the redactor was built at.
    generation: u64,
    connectors: Connectors,
    agents: Arc<AgentBook>,
    clock: Clock,
    /// The relay credentials, under a key derived from the master key.
    relay_credentials: Arc<RelayCredentials>,
    sandbox: Arc<dyn SandboxRuntime>,
    workspaces: Workspaces,
}

impl Foundation {
    async fn open(settings: &Settings, overrides: Overrides) -> anyhow::Result<Foundation> {
        let db = open_db(settings)?;
        let clock = overrides.clock.unwrap_or_else(Clock::system);
        let mut data_dir_lock = instance::DataDirLock::take(settings).await?;
        let instance_id = instance::instance_id(&db, settings).await?;
        let boot_nonce = uuid::Uuid::new_v4().simple().to_string();
        instance::register(
            &db,
            (&instance_id, &boot_nonce),
            &mut data_dir_lock,
            &clock,
            settings.sessions.lease_time,
        )
        .await?;
        let loaded = load_policy(&settings.policy_file)?;
        let secrets = open_secrets(&db, settings)?;
        let generation = secrets.generation().await?;
        let redactor = Arc::new(Redactor::new(secrets.all_values().await?)?);
        let connectors = connector_setup::build(settings, Arc::new(secrets.clone())).await?;
        // Refused here, at start, never at the first webhook.
        let agents = Arc::new(AgentBook::load_checked(
            &settings.agents_dir,
            &settings.skills_dir,
            &Catalog::builtin(),
            &settings.model,
        )?);
        let relay_credentials = Arc::new(RelayCredentials::new(
            secrets.master_key(),
            settings.relay.credential_ttl,
            clock.clone(),
        ));
        let sandbox: Arc<dyn SandboxRuntime> = match (overrides.sandbox, settings.sandbox.backend) {
            (Some(s), _) => s,
            (None, Backend::Docker) => Arc::new(
                DockerRuntime::connect(&instance_id, settings.sandbox.secrets_root.clone()).await?,
            ),
            (None, Backend::Kubernetes) => Arc::new(
                KubeRuntime::connect(
                    &instance_id,
                    KubernetesSettings {
                        relay_workspace_limits: settings.relay.workspace.limits(),
                        ..settings.sandbox.kubernetes.clone()
                    },
                    relay_credentials.clone(),
                )
                .await?,
            ),
        };
        let workspaces = Workspaces::open(RepoConfig {
            repo_path: settings.repo.path.clone(),
            default_branch: settings.repo.default_branch.clone(),
            worktrees_dir: settings.worktrees_dir(),
            remote: settings.repo.remote.clone(),
            commit_limits: settings.repo.commit_limits(),
        })?;
        Ok(Foundation {
            db,
            instance_id,
            boot_nonce,
            data_dir_lock,
            loaded: Arc::new(loaded),
            generation,
            secrets,
            redactor,
            connectors,
            agents,
            clock,
            relay_credentials,
            sandbox,
            workspaces,
        })
    }

    /// The gate, handed the supervisor's handle at construction.
    fn gate(&self, settings: &Settings, supervisor: SupervisorHandle, tasks: &Tasks) -> Arc<Gate> {
        Arc::new(Gate::new(GateParts {
            db: self.db.clone(),
            policy: self.loaded.clone(),
            connectors: self.connectors.clone(),
            redactor: self.redactor.clone(),
            redactor_source: Some(RedactorSource::new(
                self.secrets.clone(),
                Some(self.generation),
            )),
            agents: self.agents.clone(),
            public_url: settings.public_url.clone(),
            clock: self.clock.clone(),
            supervisor,
            max_pending_holds: settings.sessions.max_pending_holds,
            max_calls_per_session: settings.sessions.socket_max_connections.saturating_mul(2),
            max_calls_in_all: settings
                .sessions
                .socket_max_connections
                .saturating_mul(2)
                .saturating_mul(settings.sessions.max_live),
            call_rate: crate::gateway::rate::CallRate {
                per_second: settings.sessions.calls_per_second,
                burst: settings.sessions.calls_burst,
            },
            instance_id: self.instance_id.clone(),
            tasks: tasks.clone(),
        }))
    }
}

/// The running policy's file, name and hash, for `/readyz`.
fn policy_info(settings: &Settings, gate: &Arc<Gate>) -> crate::health::LoadedPolicyInfo {
    let (gate, path) = (gate.clone(), settings.policy_file.clone());
    Arc::new(move || {
        let p = gate.current_policy();
        crate::health::PolicyInfo {
            path: path.clone(),
            name: p.name.clone(),
            hash: p.hash_hex.clone(),
        }
    })
}

/// What `/readyz` checks: the database, the sandbox runtime and image, the policy.
fn readiness(settings: &Settings, base: &Foundation, gate: &Arc<Gate>) -> crate::health::Readiness {
    crate::health::Readiness {
        db: base.db.clone(),
        sandbox: base.sandbox.clone(),
        image: settings.sandbox.image.clone(),
        policy: policy_info(settings, gate),
        timeout: settings.telemetry.ready_timeout,
        clock: base.clock.clone(),
    }
}

/// Records in the instance registry where the other instances send a relay whose
/// session runs here: `[relay] advertise` (with the bound port when it names none), else
/// the bound relay address unless it is unspecified; none (no relay listener, or `0.0.0.0` without `advertise`) clears it.
async fn advertise_relay(
    settings: &Settings,
    base: &Foundation,
    bound: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let advertised = bound.and_then(|bound| settings.relay.advertised(bound));
    let (id, nonce) = (base.instance_id.clone(), base.boot_nonce.clone());
    let text = advertised.map(|a| a.to_string());
    base.db
        .write(move |c| crate::store::instances::set_relay_addr(c, &id, &nonce, text.as_deref()))
        .await
        .context("cannot record the relay address in the instance registry")?;
    if let Some(addr) = advertised {
        tracing::info!(%addr, "relay address advertised to the other instances");
    }
    Ok(())
}

/// On Kubernetes, the relay listener's certificate must verify, against the CA the pods
/// are given, for the host of the URL they dial (which they keep checking when sent to
/// another replica): refused at start, naming the keys, rather than by every relay.
fn check_relay_certificate(settings: &Settings) -> anyhow::Result<()> {
    let k8s = &settings.sandbox.kubernetes;
    if settings.sandbox.backend != crate::sandbox::k8s::Backend::Kubernetes
        || settings.relay.listen.is_none()
    {
        return Ok(());
    }
    // A missing file is refused where it is read, naming its key.
    let (Some(cert_file), Some(ca_file)) = (&settings.relay.cert_file, &k8s.ca_file) else {
        return Ok(());
    };
    let host = crate::relay::client::gateway_host(&k8s.gateway_url)
        .map_err(|e| anyhow::anyhow!("sandbox.kubernetes.gateway_url: {e}"))?;
    crate::relay::tls::check_names(cert_file, ca_file, &host)
}

/// Binds the metrics listener and serves `GET /metrics` on it in the background.
async fn serve_metrics(
    at: SocketAddr,
    db: &Db,
    clock: &Clock,
    limits: ConnLimits,
    tasks: &Tasks,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(at)
        .await
        .with_context(|| format!("cannot listen for metrics on {at}"))?;
    let addr = listener.local_addr()?;
    let router = metrics_http::router(metrics_http::MetricsState {
        db: db.clone(),
        clock: clock.clone(),
    });
    let stopping = tasks.stopping();
    tasks.spawn(crate::server::serve(listener, router, limits, stopping));
    Ok(addr)
}

/// The connection cap and timeouts of the people's listener.
fn server_limits(settings: &Settings) -> ConnLimits {
    ConnLimits {
        max_connections: settings.server.max_connections,
        max_per_address: settings.server.max_connections_per_address,
        header_timeout: settings.server.header_timeout,
        body_timeout: settings.server.body_timeout,
    }
}

/// The sessions' sockets, serving the sandbox API: events and agent, the model proxy
/// and the gate's tool calls.
fn session_sockets(
    settings: &Settings,
    base: &Foundation,
    gate: &Arc<Gate>,
    model: Arc<ModelProxy>,
    supervisor: SupervisorHandle,
    tasks: &Tasks,
) -> Arc<SocketHost> {
    let sandbox_api = Arc::new(SandboxApi {
        db: base.db.clone(),
        agents: base.agents.clone(),
        supervisor,
        calls: Arc::new(crate::mcp::CallsWithMcp::new(
            gate.clone(),
            settings.mcp.clone(),
            base.secrets.sealing_key(SealPurpose::McpRequestState),
        )) as Arc<dyn SandboxRouter>,
        model: Arc::new(model) as Arc<dyn SandboxRouter>,
    });
    let limits = ConnLimits {
        max_connections: settings.sessions.socket_max_connections,
        ..server_limits(settings)
    };
    Arc::new(SocketHost::new(Arc::new(sandbox_api), tasks.clone()).with_limits(limits))
}

/// What the supervisor drives: the database, the sandbox, the workspaces, the session
/// sockets, and the notes it leaves when it stops a session on its own.
fn supervisor_parts(
    settings: &Settings,
    base: &Foundation,
    gate: &Arc<Gate>,
    sockets: Arc<SocketHost>,
    tasks: &Tasks,
) -> SupervisorParts {
    let base_branch = base
        .workspaces
        .default_ref()
        .trim_start_matches("refs/heads/")
        .to_owned();
    SupervisorParts {
        db: base.db.clone(),
        instance_id: base.instance_id.clone(),
        sandbox: base.sandbox.clone(),
        workspaces: Arc::new(base.workspaces.clone()),
        api: Arc::new(crate::gateway::session_labels::LabelledSessions::new(
            sockets as Arc<dyn SessionApi>,
            gate.clone(),
        )) as Arc<dyn SessionApi>,
        agents: base.agents.clone(),
        secrets: Arc::new(base.secrets.clone()),
        image: settings.sandbox.image.clone(),
        limits: sandbox_limits(settings),
        sockets_dir: settings.sockets_dir(),
        settings: settings.sessions.clone(),
        default_agent: settings.default_agent.clone(),
        clock: base.clock.clone(),
        publisher: publisher(settings, gate, base, base_branch),
        checkpoint_every: settings.repo.checkpoint_every,
        notes: Some(Arc::new(crate::notes::stop::OutboxStopNotes::new(
            gate.outbox().clone(),
        ))),
        tasks: tasks.clone(),
        pool: sandbox_pool(settings, base),
        pod_sync: None,
    }
}

/// The pools of parked sandboxes, one per agent definition (`None` when
/// `sessions.pool_size` is 0). A parked sandbox gets its agent's command and name,
/// nothing of any thread.
fn sandbox_pool(
    settings: &Settings,
    base: &Foundation,
) -> Option<Arc<crate::session::SandboxPool>> {
    if settings.sessions.pool_size == 0 {
        return None;
    }
    let specs = base
        .agents
        .iter()
        .map(|agent| crate::sandbox::ParkSpec {
            pool: agent.name.clone(),
            image: settings.sandbox.image.clone(),
            limits: sandbox_limits(settings),
            command: agent.command.clone(),
            env: vec![("THREADGATE_AGENT".into(), agent.name.clone())],
        })
        .collect();
    Some(crate::session::SandboxPool::new(
        base.sandbox.clone(),
        specs,
        settings.sessions.pool(),
        base.clock.clone(),
    ))
}

/// The limits of every sandbox.
fn sandbox_limits(settings: &Settings) -> Limits {
    Limits {
        memory_bytes: settings.sandbox.memory_bytes.max(0) as u64,
        nano_cpus: settings.sandbox.nano_cpus.max(0) as u64,
        pids: settings.sandbox.pids.max(0) as u64,
    }
}

/// The people's router (health, webhook intake, approvals API, review page), and the
/// receiver of the stored events intake announces.
fn people_router(
    settings: &Settings,
    base: &Foundation,
    approvals: &Approvals,
    readiness: crate::health::Readiness,
    signing_secret: &SecretString,
    (hasher, oidc): (&Arc<Hasher>, Option<Arc<crate::review::oidc::Oidc>>),
) -> anyhow::Result<(axum::Router, mpsc::UnboundedReceiver<webhook::StoredEvent>)> {
    let (notify, events) = mpsc::unbounded_channel::<webhook::StoredEvent>();
    let mut intake = webhook::IntakeConfig::new(webhook::SigningSecret::new(
        signing_secret.expose_secret().as_bytes().to_vec(),
    )?);
    intake.max_body_bytes = settings.plain.max_body_bytes;
    intake.max_skew = settings.plain.max_skew;
    let intake_router = webhook::router(webhook::IntakeState {
        db: base.db.clone(),
        config: intake,
        clock: base.clock.clone(),
        notify,
    });
    let mut router = axum::Router::new()
        .merge(crate::health::router(readiness))
        .merge(intake_router)
        .merge(approvals::http::router(approvals.clone(), hasher.clone()))
        .merge(crate::review::router(
            crate::review::ReviewState::new(
                approvals.clone(),
                hasher.clone(),
                &settings.public_url,
                settings.plain.thread_url.clone(),
            )
            .with_sign_in_backoff_max(settings.server.sign_in_backoff_max)
            .with_oidc(oidc),
        ));
    if let Some(stripe_events) = connector_setup::stripe_events(
        settings,
        &base.connectors,
        Arc::new(base.secrets.clone()),
        base.clock.clone(),
        base.db.clone(),
    ) {
        router = router.merge(stripe_events);
    }
    Ok((router, events))
}

/// The team's OpenID provider when `[review.oidc]` is set: its settings checked, its
/// client secret read from the store, its discovery document fetched; any failure
/// stops the start naming the key.
async fn review_oidc(
    settings: &Settings,
    secrets: &SecretStore,
) -> anyhow::Result<Option<Arc<crate::review::oidc::Oidc>>> {
    let Some(oidc) = &settings.review.oidc else {
        return Ok(None);
    };
    let name = oidc.client_secret_name.trim();
    let secret = secrets.get(name).await.with_context(|| {
        format!(
            "review.oidc.client_secret_name: cannot read the stored secret {name:?} \
             (set it with `threadgate secrets set {name}`)"
        )
    })?;
    let cookie_key = secrets.sealing_key(SealPurpose::OidcSignIn);
    let found =
        crate::review::oidc::Oidc::discover(oidc, &settings.public_url, secret, cookie_key).await?;
    tracing::info!(issuer = %oidc.issuer_url, "reviewers may sign in at the identity provider");
    Ok(Some(Arc::new(found)))
}

/// The background work: recovery of the calls a previous run left (then
/// `recovery_done` turns true), and the loops run until shutdown: stored events to the
/// supervisor, the note outbox, the audit anchor, expiry of held calls with the sweep
/// of calls other instances left behind, and keeping the redactor current.
fn background(
    settings: &Settings,
    db: &Db,
    supervisor: &SupervisorHandle,
    approvals: &Approvals,
    (leftovers, recovery_done): (approvals::Leftovers, tokio::sync::watch::Sender<bool>),
    mut events: mpsc::UnboundedReceiver<webhook::StoredEvent>,
    tasks: &Tasks,
) {
    let gate = approvals.gate.clone();
    let sup = supervisor.clone();
    let a = approvals.clone();
    let g = gate.clone();
    tasks.spawn_until_shutdown(async move {
        while let Some(ev) = events.recv().await {
            sup.thread_changed(&ev.thread_id);
        }
    });
    tasks.spawn_until_shutdown(crate::notes::run(gate.outbox().clone()));
    tasks.spawn_until_shutdown(crate::audit::anchor::keep(
        db.clone(),
        settings.audit_anchor_path(),
        Duration::from_secs(60),
    ));
    // Recovery runs calls a previous run left approved: work in flight that shutdown
    // waits for. Expiry and the sweep, after it, are a loop that stops at the signal:
    // every second, held calls past their ttl expire, and calls another instance left
    // behind (approved and never claimed, or running on a dead instance) run here.
    let expiry = tasks.clone();
    let times = approvals::SweepTimes {
        grace: settings.sessions.renew_every(),
        alive_within: settings.sessions.lease_time,
    };
    tasks.spawn(async move {
        a.recover(leftovers).await;
        let _ = recovery_done.send(true);
        expiry.spawn_until_shutdown(async move {
            loop {
                a.expire_due().await;
                a.sweep(times).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    });
    tasks.spawn_until_shutdown(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            g.refresh_redactor().await;
        }
    });
}

impl Application {
    /// Builds every part and binds the people's listener. The supervisor's channel is
    /// made first, so every part that reaches the supervisor gets its handle when it is
    /// built; the supervisor's task starts once the parts it drives exist.
    pub async fn build(settings: Settings, overrides: Overrides) -> anyhow::Result<Application> {
        let signing_secret = settings.plain.signing_secret.clone().context(
            "refusing to start without a Plain signing secret: set THREADGATE_PLAIN_SIGNING_SECRET \
             (or plain.signing_secret_file); an unsigned webhook endpoint would let anyone open sessions",
        )?;
        match crate::server::raise_open_file_limit() {
            Ok(n) => tracing::debug!(open_files = n, "open-file limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        }
        let base = Foundation::open(&settings, overrides).await?;
        let tasks = Tasks::new();
        let heartbeat = instance::Heartbeat::new(
            &base.db,
            &base.clock,
            (base.instance_id.clone(), base.boot_nonce.clone()),
            settings.sessions.renew_every(),
        );
        instance::keep_heartbeat(&tasks, &heartbeat);
        let (handle, inbox) = Supervisor::channel(base.clock.clone());
        let gate = base.gate(&settings, handle.clone(), &tasks);
        // Before any session socket serves a call: reads rely on these marks.
        gate.load_holds().await?;
        let approvals = Approvals::new(gate.clone(), tasks.clone());
        // Before the supervisor can open a session socket: only calls a previous run
        // left behind are recovered, never one a session makes now.
        let alive_after_ms = base
            .clock
            .now_ms()
            .saturating_sub(settings.sessions.lease_ms());
        let leftovers = approvals
            .leftovers(alive_after_ms)
            .await
            .context("cannot read the calls a previous run left approved or running")?;
        let model = model_proxy(&settings, &base.secrets, gate.clone()).await?;
        tasks.spawn_until_shutdown(crate::model::retention::run(model.clone()));
        let sockets = session_sockets(&settings, &base, &gate, model, handle.clone(), &tasks);
        let pod_workspaces = Arc::new(crate::relay::PodWorkspaces::new(
            base.workspaces.clone(),
            settings.relay.workspace.limits(),
            settings.relay.workspace.pull_timeout,
            settings.relay.workspace.sync_period(),
        ));
        let mut parts = supervisor_parts(&settings, &base, &gate, sockets.clone(), &tasks);
        // Only sessions whose relay asked for their workspace are pulled from a pod; with
        // no relay listener there are none.
        if settings.relay.listen.is_some() {
            parts.pod_sync = Some(pod_workspaces.clone() as Arc<dyn crate::session::PodSync>);
        }
        Supervisor::start(parts, inbox);
        let readiness = readiness(&settings, &base, &gate);
        let oidc = review_oidc(&settings, &base.secrets).await?;
        // The reviewers' password pool, shared by the review page and the API.
        let hasher = Arc::new(Hasher::new(GLOBAL_PERMITS, GLOBAL_MAX_WAITING));
        let (router, events) = people_router(
            &settings,
            &base,
            &approvals,
            readiness,
            &signing_secret,
            (&hasher, oidc),
        )?;
        let (recovery_done, recovered) = tokio::sync::watch::channel(false);
        background(
            &settings,
            &base.db,
            &handle,
            &approvals,
            (leftovers, recovery_done),
            events,
            &tasks,
        );
        let limits = server_limits(&settings);
        let metrics_addr = match settings.telemetry.metrics_listen {
            Some(at) => Some(serve_metrics(at, &base.db, &base.clock, limits, &tasks).await?),
            None => None,
        };
        check_relay_certificate(&settings)?;
        let relay_addr = crate::relay::start(
            &settings.relay,
            RelayParts {
                credentials: base.relay_credentials.clone(),
                pod_tokens: base.sandbox.pod_token_verifier(),
                sessions: sockets.clone(),
                agents: base.agents.clone(),
                secrets: Arc::new(base.secrets.clone()),
                redirects: Some(crate::relay::Redirects {
                    db: base.db.clone(),
                    instance_id: base.instance_id.clone(),
                    lease_time: settings.sessions.lease_time,
                    clock: base.clock.clone(),
                }),
                pod_workspaces,
            },
            &tasks,
        )
        .await?;
        advertise_relay(&settings, &base, relay_addr).await?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        Ok(Application {
            addr: listener.local_addr()?,
            listener,
            router,
            db: base.db,
            gate,
            hasher,
            supervisor: handle,
            instance_id: base.instance_id,
            boot_nonce: base.boot_nonce,
            heartbeat,
            _data_dir_lock: base.data_dir_lock,
            recovered,
            metrics_addr,
            relay_addr,
            relay_credentials: base.relay_credentials,
            tasks,
            limits,
            sockets,
        })
    }

    /// Serves until `shutdown` resolves, then shuts down within [`SHUTDOWN_DEADLINE`].
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        self.run_until_within(shutdown, SHUTDOWN_DEADLINE).await
    }

    /// Serves until `shutdown` resolves, then shuts down: the people's listener stops
    /// accepting (its open requests drain), the supervisor and the loops stop, and work
    /// in flight (an approved call running, a container starting or stopping, a session
    /// socket's open request) has until `deadline` to finish before it is cut. A call cut
    /// while running is recovered at the next start. Containers keep running; the next
    /// start adopts them.
    pub async fn run_until_within(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        deadline: Duration,
    ) -> anyhow::Result<()> {
        let metrics = self
            .metrics_addr
            .map_or("off".to_owned(), |a| a.to_string());
        tracing::info!(addr = %self.addr, metrics = %metrics, instance = %self.instance_id, "threadgate serving");
        crate::server::serve(self.listener, self.router, self.limits, shutdown).await;
        tracing::info!(running = self.tasks.len(), "shutting down");
        self.supervisor.shutdown();
        // The heartbeat goes on while work in flight drains: a call still being sent
        // is a live instance's, never taken over by another instance's sweep.
        let drained = tokio::select! {
            drained = self.tasks.shutdown(deadline) => drained,
            never = self.heartbeat.clone().beat() => match never {},
        };
        drop(self.sockets);
        // A clean stop frees the instance id at once (a restart need not wait out the
        // lease time). Its session leases stay: the next start of this instance adopts
        // its containers, or another instance takes them over once they expire.
        let (id, nonce) = (self.instance_id.clone(), self.boot_nonce.clone());
        if let Err(e) = self
            .db
            .write(move |c| crate::store::instances::deregister(c, &id, &nonce))
            .await
        {
            tracing::warn!(error = %e, "cannot mark this instance stopped in the database");
        }
        tracing::info!(cut = drained.cut, "threadgate stopped");
        Ok(())
    }
}
