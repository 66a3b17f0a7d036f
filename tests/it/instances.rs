//! Several real `threadgate serve` processes on ONE SQLite database file (WAL, busy
//! timeout) and one Docker engine, each with its own data directory (instance id,
//! worktrees, sockets), repository and secrets root: deliveries of 10 threads spread
//! across two instances give each thread exactly one session and never two running
//! containers at once; `kill -9` of one instance hands its sessions to the other within
//! the lease time (measured and printed); the killed instance, started again, reaps the
//! containers whose leases it lost; a third process with a live instance's id refuses
//! to start and says why.
//!
//! Needs `scripts/docker-up.sh` and the sandbox image, like `sessions_docker`.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use threadgate::sandbox::{LABEL_INSTANCE, LABEL_THREAD};
use threadgate::secrets::MasterKey;
use threadgate::store::Db;

use crate::support;
use support::docker::docker;
use support::plain::{event_id, plain_event, thread_id};
use support::sessions::DockerWorld;
use support::wait::wait_for;

/// The lease time of the instances under test: short, so a takeover is quick to see.
const LEASE: Duration = Duration::from_secs(3);
const THREADS: usize = 10;
const WAIT: Duration = Duration::from_secs(120);

/// What every instance shares: the database file, the master key, the signing secret.
struct Shared {
    database: PathBuf,
    master_key: PathBuf,
    signing_secret: String,
}

/// One running `threadgate serve`.
struct Serve {
    child: Child,
    addr: String,
    instance: String,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn free_port() -> u16 {
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
fn write_config(
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
         database_file = {db}\n\
         instance_id = {instance:?}\n\
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
         pool_size = 0\n",
        data = q(&dir.join("data")),
        db = q(&shared.database),
        policy = q(&crate_dir.join("policies/support.yaml")),
        agents = q(&crate_dir.join("agents")),
        skills = q(&crate_dir.join("skills")),
        key = q(&shared.master_key),
        repo = q(&world.repo_path()),
        image = support::docker::image(),
        memory = 192u64 << 20,
        secrets = q(&world.secrets_root),
        lease = LEASE.as_secs(),
    );
    let path = dir.join(format!("{instance}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

fn command(config: &Path, shared: &Shared, log: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_threadgate"));
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
async fn serve(world: &DockerWorld, shared: &Shared, instance: &str, tag: &str) -> Serve {
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
fn running_threads(instance: &str) -> Vec<String> {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let format = format!("{{{{.Label \"{LABEL_THREAD}\"}}}}");
    let (code, out, err) = docker(&["ps", "--filter", &filter, "--format", &format]);
    assert_eq!(code, 0, "docker ps: {err}");
    out.lines().map(str::to_owned).collect()
}

/// Running containers per thread across `instances`.
fn containers_per_thread(instances: &[&str]) -> HashMap<String, usize> {
    let mut count = HashMap::new();
    for instance in instances {
        for thread in running_threads(instance) {
            *count.entry(thread).or_insert(0) += 1;
        }
    }
    count
}

/// The owner of each thread's lease, as the shared database says.
async fn lease_owners(db: &Db) -> HashMap<String, String> {
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

async fn running_sessions(db: &Db) -> usize {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_threads_and_one_takes_over_when_the_other_is_killed() {
    if support::docker::skip() {
        return;
    }
    let (world_a, world_b) = (DockerWorld::new(), DockerWorld::new());
    let shared = Shared {
        database: world_a.root.path().join("shared.db"),
        master_key: world_a.root.path().join("master.key"),
        signing_secret: world_a.signing_secret.clone(),
    };
    MasterKey::generate()
        .write_to(&shared.master_key)
        .expect("master key");
    let (id_a, id_b) = (world_a.instance.clone(), world_b.instance.clone());
    let a = serve(&world_a, &shared, &id_a, "a").await;
    let b = serve(&world_b, &shared, &id_b, "b").await;
    let db = Db::open(&shared.database).expect("open the shared database");

    // Watch the engine the whole time both are alive: never two running containers of
    // one thread.
    let most = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (most, watching) = (most.clone(), watching.clone());
        let (ia, ib) = (id_a.clone(), id_b.clone());
        std::thread::spawn(move || {
            while watching.load(Ordering::SeqCst) {
                for (thread, n) in containers_per_thread(&[&ia, &ib]) {
                    let mut most = most.lock().expect("lock");
                    let seen = most.entry(thread).or_insert(0);
                    *seen = (*seen).max(n);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    // Ten threads, each delivered to one instance, every other one to both (the same
    // event twice: stored once, applied once).
    let http = reqwest::Client::new();
    let threads: Vec<String> = (0..THREADS).map(|_| thread_id()).collect();
    for (i, thread) in threads.iter().enumerate() {
        let body = plain_event("thread-created.json", thread, &event_id(), Utc::now()).to_string();
        let signature =
            threadgate::webhook::sign(shared.signing_secret.as_bytes(), body.as_bytes());
        let targets: Vec<&Serve> = match i % 3 {
            0 => vec![&a],
            1 => vec![&b],
            _ => vec![&a, &b],
        };
        for to in targets {
            let response = http
                .post(format!("http://{}/webhooks/plain", to.addr))
                .header("Plain-Request-Signature", &signature)
                .header("Content-Type", "application/json")
                .body(body.clone())
                .send()
                .await
                .expect("deliver");
            assert_eq!(response.status().as_u16(), 200);
        }
    }
    let started = Instant::now();
    let all_running = wait_for(WAIT, || {
        let (ia, ib, db) = (id_a.clone(), id_b.clone(), db.clone());
        let threads = threads.clone();
        async move {
            let per = containers_per_thread(&[&ia, &ib]);
            let each = threads.iter().all(|t| per.get(t) == Some(&1));
            (each && running_sessions(&db).await == THREADS).then_some(())
        }
    })
    .await;
    assert!(
        all_running.is_some(),
        "not every thread runs once: {:?}\n--- a ---\n{}\n--- b ---\n{}",
        containers_per_thread(&[&id_a, &id_b]),
        a.log(),
        b.log()
    );
    let owners = lease_owners(&db).await;
    let on_a: Vec<String> = threads
        .iter()
        .filter(|t| owners.get(*t) == Some(&id_a))
        .cloned()
        .collect();
    let on_b = threads.len() - on_a.len();
    println!(
        "{THREADS} threads running after {:.1} s: {} on instance a, {on_b} on instance b",
        started.elapsed().as_secs_f64(),
        on_a.len()
    );
    for thread in &threads {
        let here = running_threads(if owners.get(thread) == Some(&id_a) {
            &id_a
        } else {
            &id_b
        });
        assert!(here.contains(thread), "{thread} runs on its lease's owner");
    }
    watching.store(false, Ordering::SeqCst);
    watcher.join().expect("watcher");
    let doubled: Vec<(String, usize)> = most
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(t, n)| (t.clone(), *n))
        .collect();
    assert!(doubled.is_empty(), "two containers at once: {doubled:?}");
    let events: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM events", (), |r| r.get(0)))
        .await
        .expect("count events");
    assert_eq!(events, THREADS as i64, "a delivery to both is stored once");

    // kill -9 the instance with the most sessions (a, if they are level).
    let (victim, survivor, victim_world, moved) = if on_a.len() >= on_b {
        (a, b, &world_a, on_a.clone())
    } else {
        let moved: Vec<String> = threads
            .iter()
            .filter(|t| owners.get(*t) == Some(&id_b))
            .cloned()
            .collect();
        (b, a, &world_b, moved)
    };
    let killed_id = victim.instance.clone();
    let victim_config_tag = if killed_id == id_a { "a" } else { "b" };
    let orphans = running_threads(&killed_id).len();
    let killed_at = Instant::now();
    let status = Command::new("kill")
        .args(["-9", &victim.child.id().to_string()])
        .status()
        .expect("kill -9");
    assert!(status.success());
    drop(victim);
    let leases_moved = wait_for(WAIT, || {
        let (db, moved, to) = (db.clone(), moved.clone(), survivor.instance.clone());
        async move {
            let owners = lease_owners(&db).await;
            moved
                .iter()
                .all(|t| owners.get(t) == Some(&to))
                .then(|| killed_at.elapsed())
        }
    })
    .await
    .unwrap_or_else(|| panic!("the leases did not move: {}", survivor.log()));
    let containers_moved = wait_for(WAIT, || {
        let (moved, to) = (moved.clone(), survivor.instance.clone());
        async move {
            let running = running_threads(&to);
            moved
                .iter()
                .all(|t| running.contains(t))
                .then(|| killed_at.elapsed())
        }
    })
    .await
    .unwrap_or_else(|| panic!("the sessions did not move: {}", survivor.log()));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "kill -9 of an instance with {} sessions (lease time {} s): leases taken over after \
         {:.2} s, containers running on the other instance after {:.2} s (load {})",
        moved.len(),
        LEASE.as_secs(),
        leases_moved.as_secs_f64(),
        containers_moved.as_secs_f64(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        leases_moved <= LEASE + Duration::from_secs(5),
        "leases taken over after {leases_moved:?}"
    );
    // The dead instance's containers were not reached by the new owner.
    assert_eq!(running_threads(&killed_id).len(), orphans);
    let per = containers_per_thread(&[&survivor.instance]);
    assert!(threads.iter().all(|t| per.get(t) == Some(&1)), "{per:?}");

    // The killed instance comes back: it reaps the containers whose leases it lost.
    let back = serve(victim_world, &shared, &killed_id, victim_config_tag).await;
    let reaped = wait_for(WAIT, || async {
        running_threads(&killed_id).is_empty().then_some(())
    })
    .await;
    assert!(reaped.is_some(), "orphans left running: {}", back.log());
    let per = containers_per_thread(&[&survivor.instance, &killed_id]);
    assert!(threads.iter().all(|t| per.get(t) == Some(&1)), "{per:?}");

    // A third process with the survivor's (live) instance id refuses to start.
    let dir = victim_world.root.path().join("twin");
    std::fs::create_dir_all(&dir).expect("dir");
    let config = write_config(victim_world, &shared, &dir, free_port(), &survivor.instance);
    let log = dir.join("twin.log");
    let mut twin = command(&config, &shared, &log).spawn().expect("spawn twin");
    let exited = wait_for(Duration::from_secs(60), || {
        let status = twin.try_wait().expect("try_wait");
        async move { status }
    })
    .await;
    let Some(status) = exited else {
        let _ = twin.kill();
        panic!("a second process with a live instance id kept running");
    };
    assert!(!status.success());
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("two instances with the same instance id")
            && said.contains(&survivor.instance),
        "{said}"
    );
    // The twin changed nothing: the survivor still owns and runs every thread.
    let owners = lease_owners(&db).await;
    assert!(
        threads
            .iter()
            .all(|t| owners.get(t) == Some(&survivor.instance)),
        "{owners:?}"
    );
    drop(back);
    drop(survivor);
}
