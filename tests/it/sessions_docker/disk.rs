//! The disk (issue 7 item 7): a session's workspace is its own size-limited filesystem,
//! so an agent filling `/workspace` fails to write and its session is stopped, and the
//! data disk keeps a reserve below which new sessions wait while webhooks are stored.

use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use chrono::Utc;

use crate::support::docker::exec;
use crate::support::plain::{event_id, plain_event, thread_id};
use crate::support::sessions::{AppOptions, DockerWorld};
use crate::support::wait::wait_for;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_writing_past_its_workspace_limit_fails_and_its_session_stops() {
    if crate::support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    let app = world
        .start(AppOptions {
            workspace_bytes: 64 << 20,
            ..AppOptions::default()
        })
        .await;
    let thread = thread_id();
    let body = plain_event("thread-created.json", &thread, &event_id(), Utc::now());
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let container = app.running(&thread).await;

    // The workspace is a 64 MB filesystem, and the agent writes 200 MB into it. (The
    // supervisor may stop the container right after the write fails: df goes first.)
    let (df_code, df, df_err) = exec(&container, "df -k /workspace | tail -1");
    assert_eq!(df_code, 0, "{df_err}");
    let (code, _, err) = exec(
        &container,
        "dd if=/dev/zero of=/workspace/fill bs=1M count=200",
    );
    assert_ne!(code, 0, "writing past the limit succeeded: {err}");
    // Either dd saw the filesystem full, or the supervisor saw it first and stopped the
    // container under it (docker exec then answers 137, killed, with nothing printed).
    assert!(
        err.contains("No space left") || code == 137,
        "dd failed otherwise ({code}): {err}"
    );
    let size_kb: u64 = df
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("df: {df}"));
    assert!(size_kb <= 64 * 1024, "the workspace is {size_kb} KiB: {df}");

    // On the host, the image holds at most its size: the data disk did not take 200 MB.
    let worktrees = world.data_dir().join("worktrees");
    let images: Vec<_> = std::fs::read_dir(&worktrees)
        .expect("worktrees dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "img"))
        .collect();
    assert_eq!(images.len(), 1, "one workspace image");
    let used = images[0].metadata().expect("stat image").blocks() * 512;
    assert!(used <= 66 << 20, "the image takes {used} bytes");

    // The supervisor sees the full workspace and ends the session (its container goes).
    let ended = wait_for(WAIT, || async {
        let state = app.session(&thread).await.map(|s| s.0);
        (state.as_deref() == Some("ended") && world.containers().is_empty()).then_some(())
    })
    .await;
    assert!(ended.is_some(), "session {:?}", app.session(&thread).await);
    // A person is told on the thread why the agent stopped, once.
    let notes = app.notes(&thread).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("session stopped: its workspace is full")
            && notes[0].contains("64 MiB")
            && notes[0].contains("A person takes over"),
        "{}",
        notes[0]
    );
    // The filesystem is unmounted and its image removed with the worktree.
    let left: Vec<_> = std::fs::read_dir(&worktrees)
        .expect("worktrees dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_disk_reserve_sessions_wait_and_webhooks_are_still_stored() {
    if crate::support::docker::skip() {
        return;
    }
    let world = DockerWorld::new();
    // A reserve larger than any disk: the data disk is always "below" it.
    let app = world
        .start(AppOptions {
            disk_reserve_bytes: u64::MAX / 2,
            ..AppOptions::default()
        })
        .await;
    let thread = thread_id();
    let first = event_id();
    let body = plain_event("thread-created.json", &thread, &first, Utc::now());
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(app.event_rows(&first).await, 1, "the webhook is stored");
    let queued = wait_for(WAIT, || async {
        let state = app.session(&thread).await.map(|s| s.0);
        (state.as_deref() == Some("queued")).then_some(())
    })
    .await;
    assert!(queued.is_some(), "session {:?}", app.session(&thread).await);
    // More webhooks are stored while it waits; still no container.
    let second = event_id();
    let at = Utc::now() + chrono::Duration::seconds(1);
    let body = plain_event("thread-created.json", &thread, &second, at);
    let (status, answer) = app.deliver(body.to_string().as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(app.event_rows(&second).await, 1, "the webhook is stored");
    app.supervisor.reconcile();
    app.supervisor.quiet().await;
    assert_eq!(
        app.session(&thread).await.map(|s| s.0).as_deref(),
        Some("queued")
    );
    assert!(world.containers().is_empty(), "a container started");
}
