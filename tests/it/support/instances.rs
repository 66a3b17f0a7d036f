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
            SharedDb::Url(url) => Db::open_configured(Some(url), Path::new("unused.db"))
                .expect("open the shared database"),
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
         max_live = 16\n\
         reconcile_every = \"2s\"\n\
         lease_time = \"{lease}s\"\n\
         workspace_bytes = 0\n\
         disk_reserve_bytes = 0\n\
         pool_size = 0\n\
         {store}",
        data = q(&dir.join("data")),
        db = shared.database.top_level_line(),
        store = shared.database.store_table(),
        policy = q(&crate_dir.join("policies/support.yaml")),
        agents = q(&crate_dir.join("agents")),
        skills = q(&crate_dir.join("skills")),
        key = q(&shared.master_key),
        repo = q(&world.repo_path()),
        image = super::docker::image(),
        memory = 192u64 << 20,
        secrets = q(&world.secrets_root),
        lease = shared.lease.as_secs(),
    );
    let path = dir.join(format!("{instance}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// The `threadgate` binary: named by Cargo to integration tests; benches and examples,
/// which mount this file too, find it beside their own `deps` directory.
pub fn threadgate_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_threadgate") {
        Some(bin) => PathBuf::from(bin),
        None => {
            let exe = std::env::current_exe().expect("current exe");
            let profile = exe.parent().and_then(Path::parent).expect("target dir");
            profile.join("threadgate")
        }
    }
}

pub fn command(config: &Path, shared: &Shared, log: &Path) -> Command {
    let mut command = Command::new(threadgate_bin());
    command
        .arg("--config")
        .arg(config)
        .arg("serve")
        .env("THREADGATE_PLAIN_SIGNING_SECRET", &shared.signing_secret)
        .env("RUST_LOG", "info")
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
    let dir = world.root.path().join(tag);
    std::fs::create_dir_all(&dir).expect("dir");
    let port = free_port();
    let config = write_config(world, shared, &dir, port, instance);
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

/// Running containers per thread across `instances`.
pub fn containers_per_thread(instances: &[&str]) -> HashMap<String, usize> {
    let mut count = HashMap::new();
    for instance in instances {
        for thread in running_threads(instance) {
            *count.entry(thread).or_insert(0) += 1;
        }
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

/// As [`serve`], with `extra` appended to the instance's config file (more tables, such
/// as `[stripe]`), in the directory `tag` (the same tag again is the same data
/// directory: a restart of the same instance).
pub async fn serve_with(
    world: &DockerWorld,
    shared: &Shared,
    instance: &str,
    tag: &str,
    extra: &str,
) -> Serve {
    let dir = world.root.path().join(tag);
    std::fs::create_dir_all(&dir).expect("dir");
    let port = free_port();
    let config = write_config(world, shared, &dir, port, instance);
    let mut text = std::fs::read_to_string(&config).expect("read config");
    text.push('\n');
    text.push_str(extra);
    std::fs::write(&config, text).expect("write config");
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
