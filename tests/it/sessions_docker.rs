//! End-to-end tests of sessions against a real Docker engine: the real [`Application`]
//! on port 0, signed Plain deliveries built from Plain's example payloads, real
//! containers from `threadgate-sandbox:latest`, a real git repository.
//!
//! Needs `scripts/docker-up.sh` and `scripts/build-sandbox-image.sh`. Every test has its
//! own instance id, so tests run in parallel and never touch each other's containers;
//! each removes its containers at the end, also when it fails.
//!
//! [`Application`]: threadgate::app::Application

use crate::support;

#[path = "sessions_docker/disk.rs"]
mod disk;

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use chrono::Utc;
use git2::ObjectType;
use serde_json::Value;
use support::app::TestApp;
use support::clock::TestClock;
use support::docker::{docker, exec};
use support::plain::{event_id, plain_event, retry_of, thread_id};
use support::sessions::{AppOptions, DockerWorld, branch_tip};
use support::wait::wait_for;
use threadgate::sandbox::{LABEL_INSTANCE, LABEL_SESSION, LABEL_THREAD};

const WAIT: Duration = Duration::from_secs(60);

/// Delivers a new thread (`thread-created.json`) and returns its event id and body.
async fn open_thread(app: &TestApp, thread: &str) -> (String, Value) {
    let id = event_id();
    let body = plain_event("thread-created.json", thread, &id, Utc::now());
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    (id, body)
}

/// Delivers `thread-status-transitioned.json` with status DONE, after everything else.
async fn mark_done(app: &TestApp, thread: &str) {
    let at = Utc::now() + chrono::Duration::seconds(1);
    let body = plain_event("thread-status-transitioned.json", thread, &event_id(), at);
    assert_eq!(body["payload"]["thread"]["status"], "DONE");
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
}

/// Waits until the thread's session has ended and no container of the world is left.
async fn ended_and_gone(world: &DockerWorld, app: &TestApp, thread: &str) {
    let done = wait_for(WAIT, || async {
        let state = app.session(thread).await.map(|s| s.0);
        (state.as_deref() == Some("ended") && world.containers().is_empty()).then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "session {:?}, containers {:?}",
        app.session(thread).await,
        world.containers().iter().map(|c| &c.id).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_opens_one_container_and_one_branch_per_thread() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(AppOptions::default()).await;
    let thread_a = thread_id();
    let (event_a, body_a) = open_thread(&app, &thread_a).await;

    let container_a = app.running(&thread_a).await;
    let (_, _, session_a) = app.session(&thread_a).await.expect("session a");
    let containers = world.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let c = &containers[0];
    assert_eq!(c.id, container_a);
    assert!(c.running);
    assert_eq!(
        c.label(LABEL_INSTANCE).as_deref(),
        Some(world.instance.as_str())
    );
    assert_eq!(c.label(LABEL_SESSION).as_deref(), Some(session_a.as_str()));
    assert_eq!(c.label(LABEL_THREAD).as_deref(), Some(thread_a.as_str()));
    let host = &c.inspect["HostConfig"];
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["CapDrop"], serde_json::json!(["ALL"]));
    let user = c.inspect["Config"]["User"].as_str().unwrap_or_default();
    assert!(
        !user.is_empty() && !user.starts_with("0") && !user.starts_with("root"),
        "{user}"
    );

    let repo = world.repo();
    let main = branch_tip(&repo, "main").expect("main");
    assert_eq!(
        branch_tip(&repo, &format!("threadgate/{thread_a}")),
        Some(main),
        "the thread's branch starts at main"
    );

    // Plain retries with the same id, a new body and a new signature: nothing happens.
    let retry = retry_of(&body_a);
    assert_ne!(retry.to_string(), body_a.to_string());
    let (status, answer) = app.deliver(retry.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    app.supervisor.quiet().await;
    assert_eq!(app.event_rows(&event_a).await, 1);
    let after_retry = world.containers();
    assert_eq!(after_retry.len(), 1);
    assert_eq!(after_retry[0].id, container_a);
    assert_eq!(app.sessions().await.len(), 1);

    // A second thread, opened by a customer's email: a second container.
    let thread_b = thread_id();
    let body_b = plain_event("email-received.json", &thread_b, &event_id(), Utc::now());
    let (status, answer) = app.deliver(body_b.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let container_b = app.running(&thread_b).await;
    assert_ne!(container_b, container_a);
    let ids: HashSet<String> = world.containers().into_iter().map(|c| c.id).collect();
    assert_eq!(ids, HashSet::from([container_a, container_b]));
    assert!(branch_tip(&repo, &format!("threadgate/{thread_b}")).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_container_only_the_socket_and_the_secret_file_are_there() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let secret_value = format!("demo-{}", uuid::Uuid::new_v4().simple());
    world
        .grant_secret("demo_token", &secret_value, "support")
        .await;
    let agents = world.root.path().join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    let support =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/agents/support.md"))
            .expect("support.md");
    assert!(support.contains("secrets: []"));
    std::fs::write(
        agents.join("support.md"),
        support.replace("secrets: []", "secrets: [demo_token]"),
    )
    .expect("write agent");
    // The people's listener on every address of the host, and one more of the test's.
    let app = world
        .start(AppOptions {
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            agents_dir: Some(agents),
            ..AppOptions::default()
        })
        .await;
    let outside = TcpListener::bind("0.0.0.0:0").expect("bind");
    let ports = [app.addr.port(), outside.local_addr().expect("addr").port()];

    let thread = thread_id();
    let (event, _) = open_thread(&app, &thread).await;
    let container = app.running(&thread).await;

    // The probes can fail: the same probe from a container on Docker's default bridge
    // reaches the host (and the host itself reaches every address).
    let probe = |ip: &str, port: u16| format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{ip}/{port}'");
    let mut addresses = vec!["127.0.0.1".to_owned(), "172.17.0.1".to_owned()];
    let (_, host_ips, _) = docker_host_ips();
    addresses.extend(host_ips);
    addresses.sort();
    addresses.dedup();
    let control = format!("{} || echo unreachable", probe("172.17.0.1", ports[0]));
    let (code, out, err) = docker(&[
        "run",
        "--rm",
        "--label",
        &format!("{LABEL_INSTANCE}={}", world.instance),
        &support::docker::image(),
        "bash",
        "-c",
        &control,
    ]);
    assert!(
        code == 0 && !out.contains("unreachable"),
        "control probe: {out} {err}"
    );
    for ip in &addresses {
        for port in ports {
            assert!(
                std::net::TcpStream::connect_timeout(
                    &format!("{ip}:{port}").parse().expect("addr"),
                    Duration::from_secs(2)
                )
                .is_ok(),
                "the host reaches {ip}:{port}"
            );
            let (code, _, _) = exec(&container, &probe(ip, port));
            assert_ne!(code, 0, "the sandbox reached {ip}:{port}");
        }
    }
    let (_, interfaces, _) = exec(&container, "ls /sys/class/net");
    assert_eq!(interfaces.split_whitespace().collect::<Vec<_>>(), ["lo"]);

    // The session socket answers with the thread's events, and the runner got them.
    let (code, out, err) = exec(
        &container,
        "curl -sS --fail --unix-socket /run/threadgate/api.sock 'http://sandbox/v1/events?after=0'",
    );
    assert_eq!(code, 0, "{err}");
    let page: Value = serde_json::from_str(&out).expect("events json");
    let events = page["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{page}");
    assert_eq!(events[0]["event_id"], event.as_str());
    assert_eq!(
        events[0]["event"]["payload"]["thread"]["id"],
        thread.as_str()
    );
    let seen = wait_for(WAIT, || async {
        let (code, out, _) = exec(&container, "cat /tmp/threadgate/events.jsonl");
        (code == 0 && out.contains(&event)).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "the runner never wrote the event to events.jsonl"
    );

    // The granted secret is a file; docker inspect shows no trace of it.
    let (code, out, err) = exec(&container, "cat /run/secrets/demo_token");
    assert_eq!((code, out.as_str()), (0, secret_value.as_str()), "{err}");
    let (_, env, _) = exec(&container, "env");
    assert!(!env.contains(&secret_value));
    let (code, inspected, _) = docker(&["inspect", &container]);
    assert_eq!(code, 0);
    assert!(
        inspected.contains("/run/secrets"),
        "the secrets mount is listed"
    );
    assert!(
        !inspected.contains(&secret_value),
        "docker inspect shows the secret"
    );
}

/// The host's own IPv4 addresses, as `hostname -I` lists them.
fn docker_host_ips() -> (i32, Vec<String>, String) {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    let ips = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_owned)
        .collect();
    (out.status.code().unwrap_or(-1), ips, String::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_removes_the_container_and_commits_the_work_on_the_branch() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(AppOptions::default()).await;
    let main_before = branch_tip(&world.repo(), "main").expect("main");
    let thread = thread_id();
    open_thread(&app, &thread).await;
    let container = app.running(&thread).await;

    let (code, _, err) = exec(
        &container,
        "mkdir -p notes && printf 'svc-8af1e3: log tail times out\\n' > notes/finding.md",
    );
    assert_eq!(code, 0, "{err}");
    mark_done(&app, &thread).await;
    ended_and_gone(&world, &app, &thread).await;

    let repo = world.repo();
    assert_eq!(
        branch_tip(&repo, "main"),
        Some(main_before),
        "main is never written"
    );
    let tip = branch_tip(&repo, &format!("threadgate/{thread}")).expect("branch kept");
    let commit = repo.find_commit(tip).expect("commit");
    assert_eq!(commit.parent_id(0).expect("parent"), main_before);
    assert!(commit.author().name().unwrap_or_default().contains(&thread));
    assert!(commit.message().unwrap_or_default().contains(&thread));
    let entry = commit
        .tree()
        .expect("tree")
        .get_path(std::path::Path::new("notes/finding.md"))
        .expect("the agent's file is committed");
    let blob = repo.find_blob(entry.id()).expect("blob");
    assert_eq!(blob.content(), b"svc-8af1e3: log tail times out\n");
    let worktree = world.data_dir().join("worktrees").join(&thread);
    assert!(!worktree.exists(), "the worktree is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_worktree_cannot_make_threadgate_write_outside_its_branch() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(AppOptions::default()).await;
    let thread = thread_id();
    open_thread(&app, &thread).await;
    let container = app.running(&thread).await;
    let refs_before = world.refs();
    let host_repo = world.repo_path();
    let config_before = std::fs::read(host_repo.join(".git/config")).expect("config");
    let readme_before = std::fs::read(host_repo.join("README.md")).expect("readme");
    let marker = world.root.path().join("hook-ran");

    // The agent rewrites its .git to aim at the branch it must not write, adds hooks
    // and a hooks path, points a nested .git at threadgate's own repository (by its
    // host path), and plants symlinks out of the worktree.
    let script = format!(
        r#"set -e
cd /workspace
printf 'ref: refs/heads/main\n' > .git/HEAD
mkdir -p .git/refs/heads .git/hooks
printf '0000000000000000000000000000000000000000\n' > .git/refs/heads/main
printf '[core]\n\thooksPath = .git/hooks\n\tworktree = {repo}\n' >> .git/config
for h in pre-commit post-commit reference-transaction post-checkout; do
  printf '#!/bin/sh\ntouch {marker}\n' > .git/hooks/$h; chmod +x .git/hooks/$h
done
mkdir -p nested && ln -s {repo}/.git nested/.git
ln -s {repo}/README.md escape
ln -s ../../repo/.git/refs/heads/main relative-escape
printf 'found it\n' > notes.txt
"#,
        repo = host_repo.display(),
        marker = marker.display(),
    );
    let (code, _, err) = exec(&container, &script);
    assert_eq!(code, 0, "{err}");
    mark_done(&app, &thread).await;
    ended_and_gone(&world, &app, &thread).await;

    let branch = format!("refs/heads/threadgate/{thread}");
    let refs_after = world.refs();
    let others = |refs: &[(String, String)]| -> BTreeMap<String, String> {
        refs.iter()
            .filter(|(name, _)| *name != branch)
            .cloned()
            .collect()
    };
    assert_eq!(
        others(&refs_after),
        others(&refs_before),
        "only the thread's branch moves"
    );
    assert!(!marker.exists(), "a hook from the worktree ran");
    assert_eq!(
        std::fs::read(host_repo.join(".git/config")).expect("config"),
        config_before
    );
    assert_eq!(
        std::fs::read(host_repo.join("README.md")).expect("readme"),
        readme_before
    );

    let repo = world.repo();
    let tip = branch_tip(&repo, &format!("threadgate/{thread}")).expect("branch");
    let tree = repo.find_commit(tip).expect("commit").tree().expect("tree");
    for (name, target) in [
        ("escape", format!("{}/README.md", host_repo.display())),
        (
            "relative-escape",
            "../../repo/.git/refs/heads/main".to_owned(),
        ),
    ] {
        let entry = tree
            .get_name(name)
            .unwrap_or_else(|| panic!("{name} committed"));
        assert_eq!(entry.filemode(), 0o120000, "{name} is stored as a link");
        let blob = repo.find_blob(entry.id()).expect("blob");
        assert_eq!(
            blob.content(),
            target.as_bytes(),
            "{name}'s target, not its content"
        );
    }
    assert!(tree.get_name("notes.txt").is_some());
    let mut dot_git = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.name().ok() == Some(".git") {
            dot_git.push(format!(
                "{dir}{:?}",
                entry.kind().unwrap_or(ObjectType::Any)
            ));
        }
        git2::TreeWalkResult::Ok
    })
    .expect("walk");
    assert!(
        dot_git.is_empty(),
        "a .git entry was committed: {dot_git:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_containers_and_sessions_match() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let first = world.start(AppOptions::default()).await;
    let (thread_a, thread_b) = (thread_id(), thread_id());
    open_thread(&first, &thread_a).await;
    open_thread(&first, &thread_b).await;
    let container_a = first.running(&thread_a).await;
    let container_b = first.running(&thread_b).await;

    // Crash, lose a container behind threadgate's back, and leave a stray one.
    first.crash();
    let (code, _, err) = docker(&["rm", "-f", &container_a]);
    assert_eq!(code, 0, "{err}");
    let (code, stray, err) = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        &format!("{LABEL_INSTANCE}={}", world.instance),
        "--label",
        &format!("{LABEL_SESSION}=s-stray"),
        "--label",
        &format!("{LABEL_THREAD}=th_STRAY"),
        &support::docker::image(),
        "sleep",
        "infinity",
    ]);
    assert_eq!(code, 0, "{err}");
    let stray = stray.trim().to_owned();
    // What a crash between writing a session's secrets and creating its container
    // leaves on the host's tmpfs.
    let secrets_dir = world.secrets_root.join(&world.instance);
    std::fs::create_dir_all(secrets_dir.join("s-crashed-start")).expect("stale secrets dir");
    std::fs::write(secrets_dir.join("s-crashed-start/token"), "stale").expect("stale secret");

    let second = world.start(AppOptions::default()).await;
    let matched = wait_for(WAIT, || async {
        let containers = world.containers();
        let sessions = second.sessions().await;
        let live: BTreeMap<String, String> = sessions
            .iter()
            .filter(|s| s.1 == "running")
            .filter_map(|s| Some((s.2.clone()?, s.3.clone())))
            .collect();
        let every_container_has_its_session = containers
            .iter()
            .all(|c| c.running && live.get(&c.id) == c.label(LABEL_SESSION).as_ref());
        let every_session_has_its_container = sessions.iter().all(|s| s.1 == "running")
            && live.len() == sessions.len()
            && live.keys().all(|id| containers.iter().any(|c| &c.id == id));
        (every_container_has_its_session
            && every_session_has_its_container
            && containers.len() == 2)
            .then_some(containers)
    })
    .await;
    let containers = matched.unwrap_or_else(|| {
        panic!(
            "containers {:?} do not match the sessions",
            world
                .containers()
                .iter()
                .map(|c| (&c.id, c.label(LABEL_THREAD)))
                .collect::<Vec<_>>()
        )
    });
    let ids: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    assert!(
        !ids.contains(stray.as_str()),
        "the stray container is removed"
    );
    assert!(
        ids.contains(container_b.as_str()),
        "b's container is adopted, not replaced"
    );
    let new_a = second.running(&thread_a).await;
    assert_ne!(new_a, container_a, "a is resumed in a new container");

    // Secrets directories exist for running sessions only.
    let running: HashSet<String> = second
        .sessions()
        .await
        .into_iter()
        .filter(|s| s.1 == "running")
        .map(|s| s.3)
        .collect();
    let reaped = wait_for(WAIT, || async {
        let dirs: HashSet<String> = std::fs::read_dir(&secrets_dir)
            .expect("secrets dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        (dirs == running).then_some(())
    })
    .await;
    assert!(reaped.is_some(), "secrets dirs left without a container");

    // The adopted container reaches threadgate again through its socket.
    let (code, out, err) = exec(
        &container_b,
        "curl -sS --fail --unix-socket /run/threadgate/api.sock 'http://sandbox/v1/events?after=0'",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&thread_b), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_right_after_the_first_event_leaves_no_container() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let app = world.start(AppOptions::default()).await;
    let thread = thread_id();
    // DONE arrives while the container is still being started.
    open_thread(&app, &thread).await;
    mark_done(&app, &thread).await;
    ended_and_gone(&world, &app, &thread).await;
    // And stays gone: nothing restarts it, not even a reconcile pass run after it ended.
    app.supervisor.reconcile();
    app.supervisor.quiet().await;
    assert!(world.containers().is_empty());
    assert_eq!(
        app.session(&thread).await.map(|s| s.0).as_deref(),
        Some("ended")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_session_gives_up_its_container_and_resumes_with_its_files() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let clock = TestClock::new();
    let app = world
        .start(AppOptions {
            idle_timeout: Duration::from_secs(60),
            clock: Some(clock.clock()),
            ..AppOptions::default()
        })
        .await;
    let thread = thread_id();
    open_thread(&app, &thread).await;
    let first = app.running(&thread).await;
    let (code, _, err) = exec(&first, "printf 'draft\\n' > draft.md");
    assert_eq!(code, 0, "{err}");
    // A quiet minute passes on threadgate's clock (not on the test's), still within the
    // webhook window for the customer's next email.
    clock.advance(Duration::from_secs(61));

    let idle = wait_for(WAIT, || async {
        let state = app.session(&thread).await.map(|s| s.0);
        (state.as_deref() == Some("idle") && world.containers().is_empty()).then_some(())
    })
    .await;
    assert!(idle.is_some(), "session {:?}", app.session(&thread).await);
    let repo = world.repo();
    let tip = branch_tip(&repo, &format!("threadgate/{thread}")).expect("branch");
    let tree = repo.find_commit(tip).expect("commit").tree().expect("tree");
    assert!(
        tree.get_name("draft.md").is_some(),
        "going idle commits the work"
    );

    // The customer writes again: the same session resumes on the same worktree.
    let email = plain_event("email-received.json", &thread, &event_id(), Utc::now());
    let (status, answer) = app.deliver(email.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let second = app.running(&thread).await;
    assert_ne!(second, first);
    let (code, out, _) = exec(&second, "cat draft.md");
    assert_eq!((code, out.as_str()), (0, "draft\n"));
    let (code, out, err) = exec(
        &second,
        "curl -sS --fail --unix-socket /run/threadgate/api.sock 'http://sandbox/v1/events?after=0'",
    );
    assert_eq!(code, 0, "{err}");
    let page: Value = serde_json::from_str(&out).expect("events json");
    assert_eq!(page["events"].as_array().map(Vec::len), Some(2), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_done_is_being_applied_still_ends_the_session() {
    if support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let first = world.start(AppOptions::default()).await;
    let thread = thread_id();
    open_thread(&first, &thread).await;
    let container = first.running(&thread).await;
    let (code, _, err) = exec(&container, "printf 'half done\\n' > notes.md");
    assert_eq!(code, 0, "{err}");

    // Crash as soon as the DONE is applied, while its container is being stopped.
    let done = event_id();
    let at = Utc::now() + chrono::Duration::seconds(1);
    let body = plain_event("thread-status-transitioned.json", &thread, &done, at);
    assert_eq!(first.deliver(body.to_string().as_bytes()).await.0, 200);
    let applied = wait_for(WAIT, || async {
        let id = done.clone();
        let at: Option<i64> = first
            .db
            .read(move |c| {
                c.query_row(
                    "SELECT applied_at_ms FROM events WHERE event_id = ?1",
                    [&id],
                    |r| r.get(0),
                )
            })
            .await
            .expect("read event");
        at
    })
    .await;
    assert!(applied.is_some(), "DONE never applied");
    let db = first.db.clone();
    first.crash();

    let second = world.start(AppOptions::default()).await;
    drop(db);
    ended_and_gone(&world, &second, &thread).await;
    let repo = world.repo();
    let tip = branch_tip(&repo, &format!("threadgate/{thread}")).expect("branch");
    let tree = repo.find_commit(tip).expect("commit").tree().expect("tree");
    assert!(tree.get_name("notes.md").is_some(), "the work is committed");
    assert!(!world.data_dir().join("worktrees").join(&thread).exists());
}
