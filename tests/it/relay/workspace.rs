//! The session's workspace carried into its pod and back through the relay: the relay
//! writes the thread's branch into the pod's workspace (a directory standing for the
//! `emptyDir`) before the agent's socket opens; a file the agent writes "in the pod"
//! reaches the thread's branch and the remote at the agent's checkpoint, asked through
//! the relay's socket, with the commit's guarantees (a stored secret is left out); a
//! bundle sent when the gateway asked for none is refused and changes nothing; at the
//! thread's end the pod's last work is brought back before the pod is stopped. A relay
//! started with caps smaller than the defaults refuses a workspace past them, says which,
//! writes nothing and never opens the agent's socket.

use std::time::Duration;

use threadgate::ids::SessionId;
use threadgate::relay::{Relay, RelayOptions};
use threadgate::secrets::ExposeSecret as _;
use threadgate::workspace::{BundleLimits, PodWorkspace};

use crate::support::logs::captured_text;
use crate::support::wait::wait_for;

use crate::support::relay::{RelaySetup, RunningRelay, greet};
use crate::support::sessions::{files_of, thread_tip};
use crate::support::unix_http::unix_request;
use crate::support::world::{World, stored_secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_goes_into_the_pod_and_its_commit_comes_back_to_the_branch() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    let remote = world.bare_remote();
    world.settings.repo.remote = Some(remote.display().to_string());
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let thread = ada.session.thread_id.clone();
    let session_id = SessionId::parse(ada.session.id.as_str()).expect("session id");
    let base = thread_tip(&world.settings.repo.path, &thread).expect("the thread's branch");

    let pod = PodWorkspace {
        work_dir: world.dir.path().join("pod/workspace"),
        git_dir: world.dir.path().join("pod/relay-git"),
    };
    let relay = RunningRelay::start_with(
        &app,
        world.dir.path(),
        "ada",
        RelaySetup {
            ca_file: &tls.ca_file,
            credential: app.relay_credentials.mint(&session_id),
            secrets_dir: None,
            max_connections: 32,
            workspace: None,
        },
        Some(pod.clone()),
    )
    .await;
    // In: by the time the agent's socket exists, its workspace holds the branch.
    assert_eq!(
        std::fs::read(pod.work_dir.join("README.md")).expect("the branch's file in the pod"),
        b"# billing\n"
    );
    let agent_git = git2::Repository::open(&pod.work_dir).expect("the agent's .git");
    assert_eq!(agent_git.head().expect("head").target(), Some(base));

    // The agent works in the pod, and asks for a checkpoint through the relay.
    std::fs::write(pod.work_dir.join("FINDINGS.md"), "rounding twice\n").expect("write");
    std::fs::write(pod.work_dir.join("README.md"), "# billing, fixed\n").expect("write");
    let (_, stripe_key) = stored_secrets()[0];
    std::fs::write(
        pod.work_dir.join("debug.log"),
        format!("token={stripe_key}\n"),
    )
    .expect("write");
    let in_pod = relay.session(&ada.session);
    let (status, answer) = unix_request(&in_pod.socket, "POST", "/v1/checkpoint", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["push"], "pushed", "{answer}");
    assert_eq!(answer["left_out"], 1, "the secret's file: {answer}");

    // Out: the pod's work is on the thread's branch (one commit on the base handed
    // out) and on the remote; the secret's file is not.
    let tip = thread_tip(&world.settings.repo.path, &thread).expect("branch");
    assert_eq!(answer["commit"], tip.to_string());
    let repo = git2::Repository::open(&world.settings.repo.path).expect("repo");
    assert_eq!(
        repo.find_commit(tip)
            .expect("tip")
            .parent_id(0)
            .expect("parent"),
        base
    );
    let files = files_of(&world.settings.repo.path, tip);
    assert!(
        files.contains(&("FINDINGS.md".into(), b"rounding twice\n".to_vec())),
        "{files:?}"
    );
    assert!(
        files.contains(&("README.md".into(), b"# billing, fixed\n".to_vec())),
        "{files:?}"
    );
    assert!(!files.iter().any(|(p, _)| p == "debug.log"), "{files:?}");
    assert_eq!(thread_tip(&remote, &thread), Some(tip));

    // A bundle nobody asked for (no request open) is refused before it is read, and
    // the branch and the worktree stay as they are.
    let worktree = world.settings.worktrees_dir().join(&thread);
    let readme = std::fs::read(worktree.join("README.md")).expect("worktree");
    let greeting = format!(
        "TGR1 control {}\n",
        threadgate::secrets::ExposeSecret::expose_secret(&app.relay_credentials.mint(&session_id))
    );
    let (answer, mut stream) = greet(&app, &tls.ca_file, &greeting).await;
    assert_eq!(answer, "OK\n");
    let garbage = b"# v2 git bundle\n\nPACK garbage";
    let request = format!(
        "PUT /relay/v1/workspace?seq=7 HTTP/1.1\r\nHost: threadgate\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        garbage.len()
    );
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream.write_all(request.as_bytes()).await.expect("send");
    stream.write_all(garbage).await.expect("send");
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 409"), "{reply}");
    assert_eq!(thread_tip(&world.settings.repo.path, &thread), Some(tip));
    assert_eq!(
        std::fs::read(worktree.join("README.md")).expect("worktree"),
        readme
    );

    // At the stop (the thread moves to DONE) the pod's work since the checkpoint comes
    // back too, asked for before the pod is stopped.
    std::fs::write(pod.work_dir.join("FINDINGS.md"), "rounding twice, fixed\n").expect("write");
    mark_done(&app, &thread).await;
    app.session_stops(&thread).await;
    let ended = thread_tip(&world.settings.repo.path, &thread).expect("branch");
    assert_eq!(
        repo.find_commit(ended)
            .expect("tip")
            .parent_id(0)
            .expect("parent"),
        tip
    );
    let files = files_of(&world.settings.repo.path, ended);
    assert!(
        files.contains(&("FINDINGS.md".into(), b"rounding twice, fixed\n".to_vec())),
        "{files:?}"
    );
    assert_eq!(thread_tip(&remote, &thread), Some(ended));

    relay.stop().await;
    app.stop().await;
}

/// With `[relay.workspace] sync_every` set, the pod's work reaches the gateway's
/// worktree between checkpoints without a commit; when the pod dies before the stop,
/// the stop commits what the last sync brought, and only what came after is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_brings_the_pods_work_before_the_pod_dies() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    world.settings.relay.workspace.sync_every = std::time::Duration::from_secs(1);
    world.settings.relay.workspace.pull_timeout = std::time::Duration::from_secs(2);
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let thread = ada.session.thread_id.clone();
    let session_id = SessionId::parse(ada.session.id.as_str()).expect("session id");
    let base = thread_tip(&world.settings.repo.path, &thread).expect("the thread's branch");
    let pod = PodWorkspace {
        work_dir: world.dir.path().join("pod/workspace"),
        git_dir: world.dir.path().join("pod/relay-git"),
    };
    let relay = RunningRelay::start_with(
        &app,
        world.dir.path(),
        "ada",
        RelaySetup {
            ca_file: &tls.ca_file,
            credential: app.relay_credentials.mint(&session_id),
            secrets_dir: None,
            max_connections: 32,
            workspace: None,
        },
        Some(pod.clone()),
    )
    .await;
    let worktree = world.settings.worktrees_dir().join(&thread);
    std::fs::write(pod.work_dir.join("FINDINGS.md"), "rounding twice\n").expect("write");
    crate::support::wait::eventually("the sync brings the pod's file", || async {
        std::fs::read(worktree.join("FINDINGS.md")).ok().as_deref()
            == Some(b"rounding twice\n".as_slice())
    })
    .await;
    std::fs::remove_file(pod.work_dir.join("README.md")).expect("remove");
    crate::support::wait::eventually("the sync brings the deletion", || async {
        !worktree.join("README.md").exists()
    })
    .await;
    // A sync commits nothing: the branch is where the session started.
    assert_eq!(thread_tip(&world.settings.repo.path, &thread), Some(base));

    // The pod dies; what the agent wrote after the last sync is lost, what the sync
    // brought is committed at the stop (after its pull gave up on the dead relay).
    relay.stop().await;
    std::fs::write(pod.work_dir.join("LATE.md"), "after the pod died\n").expect("write");
    mark_done(&app, &thread).await;
    app.session_stops(&thread).await;
    let ended = thread_tip(&world.settings.repo.path, &thread).expect("branch");
    assert_ne!(ended, base);
    let files = files_of(&world.settings.repo.path, ended);
    assert!(
        files.contains(&("FINDINGS.md".into(), b"rounding twice\n".to_vec())),
        "{files:?}"
    );
    assert!(
        !files
            .iter()
            .any(|(p, _)| p == "README.md" || p == "LATE.md"),
        "{files:?}"
    );
    app.stop().await;
}

/// Delivers the thread's move to DONE (Plain's example, re-aimed at `thread`).
async fn mark_done(app: &crate::support::app::TestApp, thread: &str) {
    use crate::support::plain;
    use serde_json::{Value, json};
    let body = plain::email_received(thread, "c_x", "x@x.test");
    let created: Value = serde_json::from_slice(&body).expect("json");
    let example = plain::shared_dir().join("plain/examples/thread-status-transitioned.json");
    let mut event: Value =
        serde_json::from_str(&std::fs::read_to_string(example).expect("example")).expect("json");
    let later = chrono::Utc::now() + chrono::Duration::seconds(1);
    event["id"] = json!(format!("pEv_{}", uuid::Uuid::new_v4().simple()));
    event["timestamp"] = json!(later.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    event["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] =
        created["webhookMetadata"]["webhookDeliveryAttemptTimestamp"].clone();
    event["payload"]["thread"]["id"] = json!(thread);
    assert_eq!(event["payload"]["thread"]["status"], "DONE");
    assert_eq!(
        app.send_webhook(&serde_json::to_vec(&event).expect("json"))
            .await,
        200
    );
}

/// Commits `noise.bin` (`len` bytes that do not compress) on `main` of the repository at
/// `path`, so a handed-out workspace's bundle is larger than that.
fn commit_noise(path: &std::path::Path, len: usize) {
    let repo = git2::Repository::open(path).expect("repo");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect();
    let blob = repo.blob(&noise).expect("blob");
    let parent = repo
        .find_reference("refs/heads/main")
        .and_then(|r| r.peel_to_commit())
        .expect("main");
    let mut tree = repo
        .treebuilder(Some(&parent.tree().expect("tree")))
        .expect("treebuilder");
    tree.insert("noise.bin", blob, 0o100644).expect("insert");
    let tree = repo
        .find_tree(tree.write().expect("tree"))
        .expect("find tree");
    let sig = git2::Signature::now("test", "test@example.com").expect("signature");
    repo.commit(
        Some("refs/heads/main"),
        &sig,
        &sig,
        "noise",
        &tree,
        &[&parent],
    )
    .expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_past_the_relays_configured_caps_is_refused_and_nothing_is_written() {
    let mut world = World::new().await;
    let tls = world.use_relay();
    commit_noise(&world.settings.repo.path, 8 << 10);
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let session_id = SessionId::parse(ada.session.id.as_str()).expect("session id");
    let relay_addr = app.relay_addr.expect("relay listener");
    let defaults = BundleLimits::default();

    // Each cap smaller than its default, one at a time: what the refusal must say.
    let cases = [
        (
            "bytes",
            BundleLimits {
                max_bytes: 4 << 10,
                ..defaults
            },
            "the bundle is larger than 4096 bytes",
        ),
        (
            "tree",
            BundleLimits {
                max_tree_bytes: 16,
                ..defaults
            },
            "the bundle's tree holds more than 16 bytes of files",
        ),
    ];
    for (name, limits, says) in cases {
        let pod = PodWorkspace {
            work_dir: world.dir.path().join(format!("pod-{name}/workspace")),
            git_dir: world.dir.path().join(format!("pod-{name}/relay-git")),
        };
        let token_file = world.dir.path().join(format!("{name}.token"));
        let credential = app.relay_credentials.mint(&session_id);
        std::fs::write(&token_file, credential.expose_secret()).expect("token");
        let socket = world.dir.path().join(format!("{name}.sock"));
        let relay = Relay::new(RelayOptions {
            listen: socket.clone(),
            gateway: format!("https://localhost:{}", relay_addr.port()),
            token_file,
            ca_file: tls.ca_file.clone(),
            secrets_dir: None,
            max_connections: 32,
            workspace: Some(pod.clone()),
            workspace_limits: limits,
        })
        .expect("the relay starts");
        let running = tokio::spawn(relay.run(std::future::pending::<()>()));

        let refused = wait_for(Duration::from_secs(20), || async {
            captured_text()
                .lines()
                .any(|line| line.contains(says) && line.contains("--workspace-max-"))
                .then_some(())
        })
        .await;
        assert!(refused.is_some(), "{name}: the refusal names the cap");
        assert!(!socket.exists(), "{name}: the agent's socket never opens");
        let written = std::fs::read_dir(&pod.work_dir)
            .map(|entries| entries.count())
            .unwrap_or(0);
        assert_eq!(written, 0, "{name}: nothing written into the workspace");
        assert!(
            pod.base().expect("base").is_none(),
            "{name}: no base recorded"
        );
        running.abort();
    }
    app.stop().await;
}
