//! Checkpoints (issue 19): a running session's worktree is committed and its branch
//! pushed to the configured remote (a real bare repository in the test's temp dir)
//! when the agent sends `POST /v1/checkpoint` and every `[repo] checkpoint_every`
//! (the test moves the app's clock), with the commit's guarantees (a file holding a
//! stored secret is left out); a push that fails is answered and logged without
//! stopping the session, and tried again at the next checkpoint.

use std::time::Duration;

use serde_json::Value;
use threadgate::session::{SessionState, store as sessions};

use crate::support::app::TestApp;
use crate::support::logs::captured_text;
use crate::support::sessions::{files_of, thread_tip};
use crate::support::unix_http::unix_request;
use crate::support::wait::eventually;
use crate::support::world::{Session, World, stored_secrets};

async fn checkpoint(session: &Session) -> (u16, Value) {
    unix_request(&session.socket, "POST", "/v1/checkpoint", None).await
}

/// `POST /v1/checkpoint` naming `host` as its `Host`; the status.
async fn checkpoint_from_host(session: &Session, host: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::UnixStream::connect(&session.socket)
        .await
        .expect("connect");
    let request = format!(
        "POST /v1/checkpoint HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn state(app: &TestApp, thread: &str) -> SessionState {
    let t = threadgate::ids::ThreadId::parse(thread).expect("thread id");
    app.db
        .read(move |c| sessions::get(c, &t))
        .await
        .expect("read")
        .expect("row")
        .state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_asked_by_the_agent_commits_and_pushes_without_the_secret() {
    let mut world = World::new().await;
    let remote = world.bare_remote();
    world.settings.repo.remote = Some(remote.display().to_string());
    let (app, clock) = world.start_with_clock().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let thread = ada.session.thread_id.clone();
    let worktree = world.settings.worktrees_dir().join(&thread);
    std::fs::write(worktree.join("FINDINGS.md"), "rounding twice\n").expect("write");
    let (_, stripe_key) = stored_secrets()[0];
    std::fs::write(worktree.join("debug.log"), format!("token={stripe_key}\n")).expect("write");

    // Behind the socket's one Host check, like every route of it.
    assert_eq!(
        checkpoint_from_host(&ada.session, "evil.example").await,
        403
    );
    assert_eq!(
        thread_tip(&remote, &thread),
        None,
        "a refused request pushes nothing"
    );

    let (status, answer) = checkpoint(&ada.session).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["branch"], format!("threadgate/{thread}"));
    assert_eq!(answer["push"], "pushed", "{answer}");
    assert_eq!(answer["left_out"], 1, "{answer}");
    let local = thread_tip(&world.settings.repo.path, &thread).expect("local branch");
    assert_eq!(answer["commit"], local.to_string());
    // The remote has the commit, with the finding and without the secret's file.
    assert_eq!(thread_tip(&remote, &thread), Some(local));
    let files = files_of(&remote, local);
    assert!(
        files.contains(&("FINDINGS.md".into(), b"rounding twice\n".to_vec())),
        "{files:?}"
    );
    assert!(files.iter().all(|(p, _)| p != "debug.log"), "{files:?}");
    assert!(
        files
            .iter()
            .all(|(_, c)| !String::from_utf8_lossy(c).contains(stripe_key)),
        "no file of the pushed commit holds the secret"
    );

    // Asked again at once: refused with the time to wait; the session runs on.
    let (status, answer) = checkpoint(&ada.session).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"], "too_soon");
    // Later, with nothing changed: no commit, nothing to push.
    clock.advance(Duration::from_secs(11));
    let (status, answer) = checkpoint(&ada.session).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["commit"], Value::Null, "{answer}");
    assert_eq!(answer["push"], "not_needed", "{answer}");
    assert_eq!(state(&app, &thread).await, SessionState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_session_is_checkpointed_every_period() {
    let mut world = World::new().await;
    let remote = world.bare_remote();
    world.settings.repo.remote = Some(remote.display().to_string());
    world.settings.repo.checkpoint_every = Duration::from_secs(300);
    let (app, clock) = world.start_with_clock().await;
    let bob = world.customer_session(&app, "bob@example.com", &[]).await;
    let thread = bob.session.thread_id.clone();
    let worktree = world.settings.worktrees_dir().join(&thread);
    std::fs::write(worktree.join("NOTES.md"), "first look\n").expect("write");
    // The supervisor notes when it first sees the session run, on its next tick.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(thread_tip(&remote, &thread), None, "nothing pushed yet");

    clock.advance(Duration::from_secs(301));
    let (repo, remote_path) = (world.settings.repo.path.clone(), remote.clone());
    eventually("the periodic checkpoint reaches the remote", || {
        let (repo, remote_path, thread) = (repo.clone(), remote_path.clone(), thread.clone());
        async move {
            let pushed = thread_tip(&remote_path, &thread);
            pushed.is_some() && pushed == thread_tip(&repo, &thread)
        }
    })
    .await;
    let first = thread_tip(&remote, &thread).expect("pushed");
    assert!(files_of(&remote, first).contains(&("NOTES.md".into(), b"first look\n".to_vec())));
    assert_eq!(state(&app, &thread).await, SessionState::Running);

    // The next period with a change pushes a second commit on top of the first.
    std::fs::write(worktree.join("NOTES.md"), "second look\n").expect("write");
    clock.advance(Duration::from_secs(301));
    eventually("the second checkpoint reaches the remote", || {
        let (remote_path, thread) = (remote.clone(), thread.clone());
        async move { thread_tip(&remote_path, &thread).is_some_and(|tip| tip != first) }
    })
    .await;
    let second = thread_tip(&remote, &thread).expect("pushed");
    let repo = git2::Repository::open(&remote).expect("open");
    assert_eq!(
        repo.find_commit(second)
            .expect("commit")
            .parent_id(0)
            .expect("parent"),
        first
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_push_is_answered_and_retried_and_the_session_goes_on() {
    let mut world = World::new().await;
    let remote = world.bare_remote();
    world.settings.repo.remote = Some(format!("file://{}", remote.display()));
    let (app, clock) = world.start_with_clock().await;
    let cy = world.customer_session(&app, "cy@example.com", &[]).await;
    let thread = cy.session.thread_id.clone();
    let worktree = world.settings.worktrees_dir().join(&thread);

    // The remote goes away after the session started.
    let away = world.dir.path().join("remote-away.git");
    std::fs::rename(&remote, &away).expect("move the remote away");
    std::fs::write(worktree.join("FINDINGS.md"), "found it\n").expect("write");
    let (status, answer) = checkpoint(&cy.session).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["push"], "failed", "{answer}");
    let local = thread_tip(&world.settings.repo.path, &thread).expect("local branch");
    assert_eq!(
        answer["commit"],
        local.to_string(),
        "committed all the same"
    );
    assert!(
        !answer.to_string().contains(&remote.display().to_string()),
        "the agent is not told where the remote is: {answer}"
    );
    let logs = captured_text();
    assert!(
        logs.contains("cannot push the checkpoint"),
        "the failure is logged"
    );
    // The session goes on: its socket answers and its row says running.
    assert_eq!(cy.session.get("/v1/agent").await.0, 200);
    assert_eq!(state(&app, &thread).await, SessionState::Running);

    // The remote is back: the next checkpoint pushes though nothing changed since.
    std::fs::rename(&away, &remote).expect("bring the remote back");
    clock.advance(Duration::from_secs(11));
    let (status, answer) = checkpoint(&cy.session).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["commit"], Value::Null, "{answer}");
    assert_eq!(answer["push"], "pushed", "{answer}");
    assert_eq!(thread_tip(&remote, &thread), Some(local));
}
