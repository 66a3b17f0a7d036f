//! Real `threadgate serve` processes sharing one database and one Docker engine, each
//! with its own data directory (instance id, worktrees, sockets), repository and secrets
//! root: the harness of `instances` and of the other multi-instance suites.
//!
//! The shared database is one SQLite file ([`SharedDb::File`]) or one Postgres database
//! ([`SharedDb::Url`]).

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use threadgate::sandbox::{LABEL_INSTANCE, LABEL_THREAD};
use threadgate::store::Db;

use super::docker::docker;
use super::sessions::DockerWorld;
use super::wait::wait_for;

/// The database the instances share.
#[derive(Clone, Debug)]
pub enum SharedDb {
    /// One SQLite file (WAL, busy timeout).
    File(PathBuf),
    /// One Postgres database, by URL.
    Url(String),
}

impl SharedDb {
    /// Opens the shared database the way an instance does.
    pub fn open(&self) -> Db {
        match self {
            SharedDb::File(path) => Db::open(path).expect("open the shared database"),
            SharedDb::Url(url) => Db::connect_pooled(url, 4).expect("open the shared database"),
        }
    }

    /// The top-level config line that points an instance at a database file.
    fn top_level_line(&self) -> String {
        match self {
            SharedDb::File(path) => format!("database_file = {:?}\n", path.display().to_string()),
            SharedDb::Url(_) => String::new(),
        }
    }

    /// The `[store]` table that points an instance at a Postgres database.
    fn store_table(&self) -> String {
        match self {
            SharedDb::File(_) => String::new(),
            SharedDb::Url(url) => format!("[store]\nurl = {url:?}\n"),
        }
    }
}

/// What every instance shares: the database, the master key, the signing secret, the
/// lease time.
pub struct Shared {
    pub database: SharedDb,
    pub master_key: PathBuf,
    pub signing_secret: String,
    pub lease: Duration,
}

/// One running `threadgate serve`.
pub struct Serve {
    pub child: Child,
    pub addr: String,
    pub instance: String,
    pub log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// What may differ between the instances of one suite: how many sessions each runs at
/// once and each container's memory limit.
#[derive(Clone, Debug)]
pub struct InstanceOptions {
    /// `[sessions] max_live`.
    pub max_live: usize,
    /// `[sandbox] memory_bytes`: a container's memory limit (a cap, not a reservation).
    pub memory_bytes: u64,
    /// The agent definitions (the repository's `agents/` when `None`).
    pub agents_dir: Option<PathBuf>,
    /// More config appended to the file (further tables, such as `[stripe]`).
    pub extra: String,
    /// Lines added to the `[sessions]` table (`calls_per_second = 0` for a bench).
    pub sessions_extra: String,
    /// The policy file (the repository's `policies/support.yaml` when `None`).
    pub policy_file: Option<PathBuf>,
}

impl Default for InstanceOptions {
    fn default() -> Self {
        InstanceOptions {
            max_live: 16,
            memory_bytes: 192 << 20,
            agents_dir: None,
            extra: String::new(),
            sessions_extra: String::new(),
            policy_file: None,
        }
    }
}

/// The config file of an instance of `world` (its repository, data directory, instance
/// id and secrets root) on the shared database. Warm pools are off: this suite counts a
/// thread's containers by their thread label, which a parked sandbox adopted later never
/// carries (Docker cannot relabel a container); `sessions_docker_pool` tests the pool.
pub fn write_config(
    world: &DockerWorld,
    shared: &Shared,
    dir: &Path,
    port: u16,
    instance: &str,
) -> PathBuf {
    write_config_with(
        world,
        shared,
        dir,
        (port, instance),
        &InstanceOptions::default(),
    )
}

/// [`write_config`] with `options`.
pub fn write_config_with(
    world: &DockerWorld,
    shared: &Shared,
    dir: &Path,
    (port, instance): (u16, &str),
    options: &InstanceOptions,
) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let text = format!(
        "data_dir = {data}\n\
         {db}instance_id = {instance:?}\n\
         listen = \"127.0.0.1:{port}\"\n\
         public_url = \"http://127.0.0.1:{port}\"\n\
         policy_file = {policy}\n\
         agents_dir = {agents}\n\
         skills_dir = {skills}\n\
         master_key_file = {key}\n\
         [repo]\n\
         path = {repo}\n\
         default_branch = \"main\"\n\
         [sandbox]\n\
         image = {image:?}\n\
         memory_bytes = {memory}\n\
         nano_cpus = 250000000\n\
         pids = 128\n\
         secrets_root = {secrets}\n\
         [sessions]\n\
         max_live = {max_live}\n\
         reconcile_every = \"2s\"\n\
         lease_time = \"{lease}s\"\n\
         workspace_bytes = 0\n\
         disk_reserve_bytes = 0\n\
         pool_size = 0\n\
         {sessions_extra}\n\
         {store}",
        data = q(&dir.join("data")),
        db = shared.database.top_level_line(),
        store = shared.database.store_table(),
        policy = q(options
            .policy_file
            .as_deref()
            .unwrap_or(&crate_dir.join("policies/support.yaml"))),
        agents = q(options
            .agents_dir
            .as_deref()
            .unwrap_or(&crate_dir.join("agents"))),
        skills = q(&crate_dir.join("skills")),
        key = q(&shared.master_key),
        repo = q(&world.repo_path()),
        image = super::docker::image(),
        memory = options.memory_bytes,
        max_live = options.max_live,
        secrets = q(&world.secrets_root),
        lease = shared.lease.as_secs(),
        sessions_extra = options.sessions_extra,
    );
    let text = format!("{text}\n{}", options.extra);
    let path = dir.join(format!("{instance}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// Writes into `dir` a quiet `support` agent: the repository's, run with the sandbox
/// image's default command (`sleep infinity`) instead of the agent runner, so a session
/// is a container that waits and asks nothing (no model, no gateway): what suites that
/// count sessions and containers by the hundred need, and nothing they check changes.
pub fn quiet_agents(dir: &Path) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let support = std::fs::read_to_string(crate_dir.join("agents/support.md")).expect("support.md");
    let quiet: String = support
        .lines()
        .filter(|line| !line.starts_with("command:"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_ne!(quiet, support, "support.md names its command");
    std::fs::create_dir_all(dir).expect("agents dir");
    std::fs::write(dir.join("support.md"), quiet).expect("write the quiet agent");
    dir.to_owned()
}

/// The `threadgate` binary: `THREADGATE_TEST_BIN` when set (a bench comparing two
/// builds), else the one Cargo names to integration tests; benches and examples, which
/// mount this file too, find it beside their own `deps` directory.
pub fn threadgate_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("THREADGATE_TEST_BIN") {
        return PathBuf::from(bin);
    }
    match option_env!("CARGO_BIN_EXE_threadgate") {
        Some(bin) => PathBuf::from(bin),
        None => {
            let exe = std::env::current_exe().expect("current exe");
            let profile = exe.parent().and_then(Path::parent).expect("target dir");
            profile.join("threadgate")
        }
    }
}

/// The instances' `RUST_LOG`: `info`, or `THREADGATE_TEST_SERVE_LOG` (e.g.
/// `info,threadgate::session=debug` to follow leases while debugging a suite).
fn serve_log_filter() -> String {
    std::env::var("THREADGATE_TEST_SERVE_LOG").unwrap_or_else(|_| "info".into())
}

pub fn command(config: &Path, shared: &Shared, log: &Path) -> Command {
    let mut command = Command::new(threadgate_bin());
    command
        .arg("--config")
        .arg(config)
        .arg("serve")
        .env("THREADGATE_PLAIN_SIGNING_SECRET", &shared.signing_secret)
        .env("RUST_LOG", serve_log_filter())
        .env_remove("THREADGATE_MASTER_KEY")
        .env_remove("THREADGATE_DATA_DIR")
        .env_remove("THREADGATE_INSTANCE_ID")
        .env_remove("THREADGATE_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    command
}

/// Starts an instance of `world` and waits until it answers `/healthz`.
pub async fn serve(world: &DockerWorld, shared: &Shared, instance: &str, tag: &str) -> Serve {
    serve_with(world, shared, (instance, tag), &InstanceOptions::default()).await
}

/// [`serve`] with `options`.
pub async fn serve_with(
    world: &DockerWorld,
    shared: &Shared,
    (instance, tag): (&str, &str),
    options: &InstanceOptions,
) -> Serve {
    let dir = world.root.path().join(tag);
    std::fs::create_dir_all(&dir).expect("dir");
    let port = free_port();
    let config = write_config_with(world, shared, &dir, (port, instance), options);
    let log = dir.join("serve.log");
    let child = command(&config, shared, &log).spawn().expect("spawn serve");
    let mut serve = Serve {
        child,
        addr: format!("127.0.0.1:{port}"),
        instance: instance.to_owned(),
        log,
    };
    let http = reqwest::Client::new();
    let up = wait_for(Duration::from_secs(60), || {
        let url = format!("http://{}/healthz", serve.addr);
        let http = http.clone();
        async move {
            let ok = http
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            ok.then_some(())
        }
    })
    .await;
    if up.is_none() || serve.child.try_wait().expect("try_wait").is_some() {
        panic!("instance {tag} did not start: {}", serve.log());
    }
    serve
}

/// The threads of the running containers labelled with `instance`.
pub fn running_threads(instance: &str) -> Vec<String> {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let format = format!("{{{{.Label \"{LABEL_THREAD}\"}}}}");
    let (code, out, err) = docker(&["ps", "--filter", &filter, "--format", &format]);
    assert_eq!(code, 0, "docker ps: {err}");
    out.lines().map(str::to_owned).collect()
}

/// Running containers per thread across `instances` (one `docker ps`, [`running_of`]).
pub fn containers_per_thread(instances: &[&str]) -> HashMap<String, usize> {
    let mut count = HashMap::new();
    for running in running_of(instances) {
        *count.entry(running.thread).or_insert(0) += 1;
    }
    count
}

/// The owner of each thread's lease, as the shared database says.
pub async fn lease_owners(db: &Db) -> HashMap<String, String> {
    let now = Utc::now().timestamp_millis();
    db.read(move |c| {
        let mut stmt =
            c.prepare("SELECT thread_id, owner FROM session_leases WHERE expires_at_ms > ?1")?;
        let rows = stmt.query_map([now], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    })
    .await
    .expect("read leases")
}

pub async fn running_sessions(db: &Db) -> usize {
    db.read(|c| {
        c.query_row(
            "SELECT count(*) FROM sessions WHERE state = 'running'",
            (),
            |r| r.get::<_, i64>(0),
        )
    })
    .await
    .map(|n| usize::try_from(n).expect("a count"))
    .expect("read sessions")
}

/// A running container as `docker ps` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Running {
    pub id: String,
    pub instance: String,
    pub thread: String,
}

/// The running containers of `instances` (with their thread label), from one `docker
/// ps` (a sampler watching a hundred containers cannot afford one call per instance).
pub fn running_of(instances: &[&str]) -> Vec<Running> {
    let filter = format!("label={LABEL_INSTANCE}");
    let format = format!(
        "{{{{.ID}}}} {{{{.Label \"{LABEL_INSTANCE}\"}}}} {{{{.Label \"{LABEL_THREAD}\"}}}}"
    );
    let (code, out, err) = docker(&["ps", "--no-trunc", "--filter", &filter, "--format", &format]);
    assert_eq!(code, 0, "docker ps: {err}");
    out.lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            let (id, instance, thread) = (parts.next()?, parts.next()?, parts.next()?);
            (instances.contains(&instance) && !thread.is_empty()).then(|| Running {
                id: id.to_owned(),
                instance: instance.to_owned(),
                thread: thread.to_owned(),
            })
        })
        .collect()
}

/// Sends `body` to `to`'s webhook, signed with the shared secret: the status, or the
/// connection's error (a killed instance).
pub async fn deliver(
    http: &reqwest::Client,
    shared: &Shared,
    to: &str,
    body: &serde_json::Value,
) -> Result<u16, reqwest::Error> {
    let body = body.to_string();
    let signature = threadgate::webhook::sign(shared.signing_secret.as_bytes(), body.as_bytes());
    let response = http
        .post(format!("http://{to}/webhooks/plain"))
        .header("Plain-Request-Signature", signature)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await?;
    Ok(response.status().as_u16())
}

/// `kill -9` of the process `pid` (a [`Serve`]'s `child.id()`): no shutdown, no
/// deregistration, no lease released.
pub fn kill9(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill -9");
    assert!(status.success(), "kill -9 {pid}");
}

/// The machine's load average (1, 5 and 15 minutes), for figures' conditions.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every stored delivery's event id and whether it has been applied.
pub async fn stored_events(db: &Db) -> HashMap<String, bool> {
    db.read(|c| {
        let mut stmt = c.prepare("SELECT event_id, applied_at_ms FROM events")?;
        let rows = stmt.query_map((), |r| {
            Ok((r.get(0)?, r.get::<_, Option<i64>>(1)?.is_some()))
        })?;
        rows.collect()
    })
    .await
    .expect("read events")
}

/// Each thread's session state, as the shared database says.
pub async fn session_states(db: &Db) -> HashMap<String, String> {
    db.read(|c| {
        let mut stmt = c.prepare("SELECT thread_id, state FROM sessions")?;
        let rows = stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    })
    .await
    .expect("read sessions")
}

/// Transactions committed and rolled back on the shared Postgres database so far, as
/// its statistics say (they lag by up to a second or so: compare over a few seconds).
pub async fn pg_transactions(db: &Db) -> i64 {
    db.read(|c| {
        c.query_row(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database \
             WHERE datname = current_database()",
            (),
            |r| r.get::<_, i64>(0),
        )
    })
    .await
    .expect("read the database's statistics")
}
