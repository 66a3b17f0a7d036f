//! Warm starts against the real Docker engine: what a parked sandbox holds before and
//! after adoption, one sandbox per thread, a crash between adoption and binding,
//! reconciliation of parked sandboxes after a restart, a pool miss, and the idle limit.
//!
//! Parking mounts a thread's directories into a running container, which needs root
//! (as in CI); run as another user these tests check that the pool stays off.

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use support::app::TestApp;
use support::docker::exec;
use support::plain::{event_id, plain_event, thread_id};
use support::sandbox::TestEnv;
use support::sessions::{AppOptions, DockerWorld};
use support::wait::wait_for;
use threadgate::sandbox::{
    DockerRuntime, LABEL_INSTANCE, LABEL_POOL, LABEL_SESSION, LABEL_SLOT, LABEL_THREAD, ParkSpec,
    ParkedSandbox, SandboxError, SandboxRuntime,
};

const WAIT: Duration = Duration::from_secs(60);

fn root() -> bool {
    rustix_uid() == 0
}

fn rustix_uid() -> u32 {
    // The tests' own process: root in CI and on the dev machine.
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX)
}

fn park_spec(pool: &str) -> ParkSpec {
    ParkSpec {
        pool: pool.into(),
        image: support::docker::image(),
        limits: threadgate::sandbox::Limits {
            memory_bytes: 256 << 20,
            nano_cpus: 500_000_000,
            pids: 64,
        },
        command: None,
        env: vec![("THREADGATE_AGENT".into(), pool.into())],
    }
}

/// Every entry directly in `dir` (empty when there is none).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks that a parked sandbox holds nothing of any thread: labels, name, env and
/// mounts name only the instance, pool and slot, and its three directories are empty
/// inside and on the host. `forbidden` are strings of threads that must appear nowhere.
async fn assert_holds_nothing(
    parked: &ParkedSandbox,
    instance: &str,
    pool_root: &Path,
    forbidden: &[String],
) {
    let inspected = support::docker::inspect(&parked.container_id);
    let json = inspected.to_string();
    for text in forbidden {
        assert!(
            !json.contains(text.as_str()),
            "{text:?} in the parked sandbox's inspect"
        );
    }
    let labels = inspected["Config"]["Labels"].as_object().expect("labels");
    let ours: BTreeSet<&str> = labels
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("threadgate.") && *k != "threadgate.context")
        .collect();
    assert_eq!(
        ours,
        BTreeSet::from([LABEL_INSTANCE, LABEL_POOL, LABEL_SLOT]),
        "labels: instance, pool and slot only"
    );
    assert_eq!(labels[LABEL_INSTANCE], instance);
    assert!(!labels.contains_key(LABEL_SESSION) && !labels.contains_key(LABEL_THREAD));
    assert_eq!(
        parked.name,
        format!("threadgate-{instance}-pool-{}", parked.slot)
    );
    let env: Vec<&str> = inspected["Config"]["Env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        env.iter()
            .all(|e| !e.starts_with("THREADGATE_THREAD") && !e.starts_with("THREADGATE_SESSION")),
        "{env:?}"
    );
    let slot_dir = pool_root.join(&parked.slot);
    for mount in inspected["Mounts"].as_array().expect("mounts") {
        let source = mount["Source"].as_str().expect("source");
        assert!(
            Path::new(source).starts_with(&slot_dir),
            "mount {source} outside the slot {}",
            slot_dir.display()
        );
        assert_eq!(mount["Propagation"], "rslave", "{mount}");
    }
    let (code, out, err) = exec(
        &parked.container_id,
        "ls -A /workspace /run/threadgate /run/secrets | grep -v ':$' | grep -v '^$' || true",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "", "files inside a parked sandbox");
    for dir in ["workspace", "socket", "secrets"] {
        assert!(
            entries(&slot_dir.join(dir)).is_empty(),
            "host {dir} not empty"
        );
    }
    assert!(!slot_dir.join("adopted").exists());
}

#[tokio::test]
async fn a_parked_sandbox_holds_nothing_until_adopted_and_is_never_adopted_twice() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    if !root() {
        let refused = env.runtime.park(&park_spec("support")).await;
        assert!(matches!(refused, Err(SandboxError::PoolUnsupported { .. })));
        return;
    }
    let pool_root = support::sandbox::secrets_root().join(format!("{}.pool", env.instance));
    let parked = env.runtime.park(&park_spec("support")).await.unwrap();
    assert_eq!(
        env.runtime.list_parked().await.unwrap(),
        vec![ParkedSandbox {
            created_at_ms: env.runtime.list_parked().await.unwrap()[0].created_at_ms,
            ..parked.clone()
        }]
    );
    assert!(
        env.runtime.list().await.unwrap().is_empty(),
        "parked is not listed as a session's"
    );
    assert_holds_nothing(&parked, &env.instance, &pool_root, &[]).await;

    // Adoption: the workspace, the secret and the socket appear in the running container.
    std::fs::write(env.workspace.path().join("thread-file.txt"), "of th_adopt").unwrap();
    let _listener = tokio::net::UnixListener::bind(env.socket_dir.path().join("api.sock")).unwrap();
    let spec = env.spec("adopt", "fake_key_adopted_secret");
    let handle = env.runtime.adopt(&parked, &spec).await.unwrap();
    assert_eq!(handle.container_id, parked.container_id);
    let id = &parked.container_id;
    let (_, out, _) = exec(id, "cat /workspace/thread-file.txt");
    assert_eq!(out, "of th_adopt");
    let (_, out, _) = exec(id, "cat /run/secrets/API_TOKEN");
    assert_eq!(out, "fake_key_adopted_secret");
    let (code, _, _) = exec(id, "test -S /run/threadgate/api.sock");
    assert_eq!(code, 0, "the socket is there");
    for read_only in ["/run/secrets/x", "/run/threadgate/x"] {
        let (code, _, _) = exec(id, &format!("touch {read_only}"));
        assert_ne!(code, 0, "{read_only} must be read-only");
    }
    let (code, _, err) = exec(id, "touch /workspace/new && test -f /workspace/new");
    assert_eq!(code, 0, "the workspace is writable: {err}");
    assert!(
        env.workspace.path().join("new").exists(),
        "written to the thread's worktree"
    );
    let inspect = support::docker::inspect(id).to_string();
    assert!(!inspect.contains("fake_key_adopted_secret"));

    // Listed as the session's, no longer parked; never adopted again.
    let listed = env.runtime.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].session_id.as_str(), listed[0].thread_id.as_str()),
        ("adopt", "th_adopt")
    );
    assert!(env.runtime.list_parked().await.unwrap().is_empty());
    let again = env
        .runtime
        .adopt(&parked, &env.spec("other", "fake_key_other"))
        .await;
    assert!(
        matches!(again, Err(SandboxError::NotAdoptable { .. })),
        "{again:?}"
    );
    let listed = env.runtime.list().await.unwrap();
    assert_eq!(
        (listed.len(), listed[0].session_id.as_str()),
        (1, "adopt"),
        "still its first session's only"
    );
    let (_, out, _) = exec(id, "cat /run/secrets/API_TOKEN");
    assert_eq!(
        out, "fake_key_adopted_secret",
        "nothing of the other session entered"
    );
    let secrets = support::sandbox::secrets_root().join(&env.instance);
    assert!(!secrets.join("other").exists());

    // Stopped: the container, the slot and the session's secrets go.
    env.runtime.stop(id).await.unwrap();
    assert!(support::docker::containers_of(&env.instance).is_empty());
    assert!(
        !pool_root.join(&parked.slot).exists(),
        "its slot is released"
    );
    assert!(!secrets.join("adopt").exists(), "its secrets are removed");
    assert!(
        env.workspace.path().join("thread-file.txt").exists(),
        "releasing the slot never touches the thread's worktree"
    );
}

/// Delivers a new thread and returns nothing; the session starts in the background.
async fn open_thread(app: &TestApp, thread: &str) {
    let body = plain_event("thread-created.json", thread, &event_id(), Utc::now());
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
}

async fn mark_done(app: &TestApp, thread: &str) {
    let at = Utc::now() + chrono::Duration::seconds(1);
    let body = plain_event("thread-status-transitioned.json", thread, &event_id(), at);
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
}

/// A runtime of the world's instance, to look at its parked sandboxes.
async fn runtime_of(world: &DockerWorld) -> DockerRuntime {
    DockerRuntime::connect(&world.instance, world.secrets_root.clone())
        .await
        .expect("connect")
}

/// Waits until `count` sandboxes are parked; answers their ids.
async fn parked(runtime: &DockerRuntime, count: usize) -> Vec<ParkedSandbox> {
    wait_for(WAIT, || async {
        let parked = runtime.list_parked().await.ok()?;
        (parked.len() == count && parked.iter().all(|p| p.clean)).then_some(parked)
    })
    .await
    .unwrap_or_else(|| panic!("{count} parked sandboxes not there after {WAIT:?}"))
}

fn ids(parked: &[ParkedSandbox]) -> BTreeSet<String> {
    parked.iter().map(|p| p.container_id.clone()).collect()
}

fn pool_options(size: usize) -> AppOptions {
    AppOptions {
        pool_size: size,
        ..AppOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_adopt_one_parked_sandbox_each_and_the_refill_holds_nothing_of_them() {
    if support::docker::skip() || !root() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(pool_options(2)).await;
    let runtime = runtime_of(&world).await;
    let first = ids(&parked(&runtime, 2).await);
    let (warm0, cold0) = (
        threadgate::metrics::session_launches("warm"),
        threadgate::metrics::session_launches("cold"),
    );

    let (a, b) = (thread_id(), thread_id());
    open_thread(&app, &a).await;
    open_thread(&app, &b).await;
    let (container_a, container_b) = (app.running(&a).await, app.running(&b).await);
    assert_ne!(
        container_a, container_b,
        "two threads never share a sandbox"
    );
    assert!(first.contains(&container_a) && first.contains(&container_b));
    assert!(threadgate::metrics::session_launches("warm") >= warm0 + 2);
    assert_eq!(threadgate::metrics::session_launches("cold"), cold0);
    // Each sees its own worktree (its branch names its thread) and its own socket.
    for (container, thread) in [(&container_a, &a), (&container_b, &b)] {
        let (_, head, _) = exec(container, "cat /workspace/.git/HEAD");
        assert!(head.contains(thread.as_str()), "{head}");
        let (code, _, _) = exec(container, "test -S /run/threadgate/api.sock");
        assert_eq!(code, 0);
    }
    let (_, _, session_a) = app.session(&a).await.expect("session a");
    let (_, _, session_b) = app.session(&b).await.expect("session b");

    // The refill parks fresh sandboxes that hold nothing of either thread.
    let refill = wait_for(WAIT, || async {
        let now = runtime.list_parked().await.ok()?;
        (now.len() == 2
            && now
                .iter()
                .all(|p| !first.contains(&p.container_id) && p.clean))
        .then_some(now)
    })
    .await
    .expect("the pool refilled");
    let pool_root = world.secrets_root.join(format!("{}.pool", world.instance));
    let forbidden = [a.clone(), b.clone(), session_a.clone(), session_b.clone()];
    for p in &refill {
        assert_holds_nothing(p, &world.instance, &pool_root, &forbidden).await;
    }

    // Ended threads' sandboxes are removed, never parked again.
    mark_done(&app, &a).await;
    mark_done(&app, &b).await;
    let gone = wait_for(WAIT, || async {
        let left: BTreeSet<String> = support::docker::containers_of(&world.instance)
            .into_iter()
            .map(|c| c.id)
            .collect();
        (!left.contains(&container_a) && !left.contains(&container_b)).then_some(())
    })
    .await;
    assert!(gone.is_some(), "adopted sandboxes removed at the end");
    let now = ids(&runtime.list_parked().await.unwrap());
    assert!(!now.contains(&container_a) && !now.contains(&container_b));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_adopted_but_never_bound_is_removed_after_a_restart_and_given_to_nobody() {
    if support::docker::skip() || !root() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(pool_options(1)).await;
    let runtime = runtime_of(&world).await;
    let ghost = parked(&runtime, 1).await.remove(0);
    app.crash();

    // The crash came after the adoption was recorded and the thread's directories
    // bound, before the session's row named the container.
    let env_dir = tempfile::tempdir().unwrap();
    let (workspace, socket) = (env_dir.path().join("ws"), env_dir.path().join("sock"));
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&socket).unwrap();
    let spec = threadgate::sandbox::SandboxSpec {
        session_id: threadgate::ids::SessionId::parse("ses_ghost").unwrap(),
        thread_id: threadgate::ids::ThreadId::parse("th_ghost").unwrap(),
        image: support::docker::image(),
        workspace_dir: workspace,
        socket_dir: socket,
        secrets: vec![(
            "API_TOKEN".into(),
            threadgate::secrets::secret_bytes("fake_key_ghost"),
        )],
        limits: park_spec("support").limits,
        command: None,
        env: vec![],
    };
    runtime.adopt(&ghost, &spec).await.expect("adopt");

    let app = world.start(pool_options(1)).await;
    let thread = thread_id();
    open_thread(&app, &thread).await;
    let container = app.running(&thread).await;
    assert_ne!(
        container, ghost.container_id,
        "never bound to another thread"
    );
    let removed = wait_for(WAIT, || async {
        let left: Vec<String> = support::docker::containers_of(&world.instance)
            .into_iter()
            .map(|c| c.id)
            .collect();
        (!left.contains(&ghost.container_id)).then_some(())
    })
    .await;
    assert!(removed.is_some(), "the adopted, unbound sandbox is removed");
    assert!(
        !world
            .secrets_root
            .join(&world.instance)
            .join("ses_ghost")
            .exists(),
        "with its secrets"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_clean_parked_sandboxes_are_taken_over_and_then_adopted() {
    if support::docker::skip() || !root() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(pool_options(1)).await;
    let runtime = runtime_of(&world).await;
    let before = ids(&parked(&runtime, 1).await);
    app.stop().await;

    let app = world.start(pool_options(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        ids(&runtime.list_parked().await.unwrap()),
        before,
        "taken over, not replaced"
    );
    let thread = thread_id();
    open_thread(&app, &thread).await;
    let container = app.running(&thread).await;
    assert!(
        before.contains(&container),
        "the restarted pool hands it out"
    );
    app.stop().await;

    // Restarted with a short idle limit: the parked sandbox is too old and replaced.
    let now = ids(&parked(&runtime, 1).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let app = world
        .start(AppOptions {
            pool_max_idle: Duration::from_secs(1),
            ..pool_options(1)
        })
        .await;
    let replaced = wait_for(WAIT, || async {
        let parked = runtime.list_parked().await.ok()?;
        (parked.len() == 1 && !now.contains(&parked[0].container_id)).then_some(())
    })
    .await;
    assert!(
        replaced.is_some(),
        "a stale parked sandbox is replaced at start"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_sandbox_past_its_idle_time_is_replaced() {
    if support::docker::skip() || !root() {
        return;
    }
    let world = DockerWorld::new();
    let app = world
        .start(AppOptions {
            pool_max_idle: Duration::from_secs(3),
            ..pool_options(1)
        })
        .await;
    let runtime = runtime_of(&world).await;
    let first = ids(&parked(&runtime, 1).await);
    let replaced = wait_for(WAIT, || async {
        let now = ids(&runtime.list_parked().await.ok()?);
        let all: BTreeSet<String> = support::docker::containers_of(&world.instance)
            .into_iter()
            .map(|c| c.id)
            .collect();
        (now.len() == 1 && now.is_disjoint(&first) && all.is_disjoint(&first)).then_some(())
    })
    .await;
    assert!(
        replaced.is_some(),
        "the old one removed, a fresh one parked"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_miss_starts_a_container_and_is_counted_cold() {
    if support::docker::skip() || !root() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(pool_options(1)).await;
    let runtime = runtime_of(&world).await;
    let pooled = ids(&parked(&runtime, 1).await);
    let (warm0, cold0) = (
        threadgate::metrics::session_launches("warm"),
        threadgate::metrics::session_launches("cold"),
    );
    let threads = [thread_id(), thread_id(), thread_id()];
    for thread in &threads {
        open_thread(&app, thread).await;
    }
    let mut containers = BTreeSet::new();
    for thread in &threads {
        containers.insert(app.running(thread).await);
    }
    assert_eq!(containers.len(), 3, "one sandbox per thread");
    let all = support::docker::containers_of(&world.instance);
    let cold = all
        .iter()
        .filter(|c| containers.contains(&c.id) && c.label(LABEL_SESSION).is_some())
        .count();
    let warm = all
        .iter()
        .filter(|c| containers.contains(&c.id) && c.label(LABEL_SLOT).is_some())
        .count();
    assert_eq!(warm + cold, 3);
    assert!(cold >= 1, "the pool of one cannot serve three at once");
    assert!(
        containers.iter().any(|c| pooled.contains(c)),
        "the parked one was used"
    );
    assert!(threadgate::metrics::session_launches("cold") >= cold0 + cold as u64);
    assert!(threadgate::metrics::session_launches("warm") >= warm0 + warm as u64);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_in_an_adopted_sandbox_works_the_thread_end_to_end() {
    if support::docker::skip() || !root() {
        return;
    }
    let mut w = support::agent::AgentWorld::new(threadgate::model::Provider::Scripted).await;
    w.world.settings.sessions.pool_size = 1;
    let app = w.start().await;
    let runtime =
        DockerRuntime::connect(&w.instance, w.world.settings.sandbox.secrets_root.clone())
            .await
            .expect("connect");
    let pooled = ids(&parked(&runtime, 1).await);
    let customer = w.customer(&[4200, 4200]).await;
    let thread = w
        .open_thread(
            &app,
            &customer,
            "Hi, I was charged twice for my order this month.",
        )
        .await;
    let container = app.running(&thread).await;
    assert!(
        pooled.contains(&container),
        "the thread adopted the parked sandbox"
    );
    let stripe = &w.world.stripe;
    support::wait::eventually("one refund of the duplicate", || async {
        !support::world::refunds(stripe).await.is_empty()
    })
    .await;
    support::wait::eventually("the reply on the thread", || async {
        !w.world.plain.thread(&thread).replies().is_empty()
    })
    .await;
    let made = support::world::refunds(stripe).await;
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["charge"], customer.charges[1].as_str());
    app.stop().await;
}
