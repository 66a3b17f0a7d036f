//! What the engineers see (issue 8): a session that ends with changes pushes its branch
//! to the configured remote (a real bare repository in the test's temp dir) and opens a
//! draft pull request on the configured GitHub repository (the stub) whose description
//! links the Plain thread and carries the agent's latest note; ending the thread again
//! updates that pull request instead of opening another. A session without changes
//! pushes nothing, and without a remote the branch stays local.

use serde_json::{Value, json};
use threadgate::session::publish::OnDone;
use threadgate::session::{SessionState, store as sessions};

use crate::support::app::TestApp;
use crate::support::plain::{email_received, plain_id};
use crate::support::sessions::thread_tip;
use crate::support::wait::eventually;
use crate::support::world::{GITHUB_REPO, World};

/// A `thread.status_transitioned` delivery to DONE for `thread_id`, a second after now.
fn done(thread_id: &str) -> Vec<u8> {
    let path =
        crate::support::plain::shared_dir().join("plain/examples/thread-status-transitioned.json");
    let mut event: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("example")).expect("json");
    let at = (chrono::Utc::now() + chrono::Duration::seconds(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    event["id"] = json!(format!("pEv_{}", uuid::Uuid::new_v4().simple()));
    event["timestamp"] = json!(at);
    event["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] = json!(at);
    event["payload"]["thread"]["id"] = json!(thread_id);
    event["payload"]["previousThread"]["id"] = json!(thread_id);
    event["payload"]["thread"]["title"] = json!("Invoice [total] is wrong");
    serde_json::to_vec(&event).expect("serialize")
}

async fn end(app: &TestApp, thread: &str) {
    assert_eq!(app.send_webhook(&done(thread)).await, 200);
    eventually("the session ends", || {
        let t = threadgate::ids::ThreadId::parse(thread).expect("thread id");
        async move {
            let row = app
                .db
                .read(move |c| sessions::get(c, &t))
                .await
                .expect("read");
            row.is_some_and(|r| r.state == SessionState::Ended)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_session_pushes_its_branch_and_opens_one_draft_pull_request() {
    let mut world = World::new().await;
    let remote = world.bare_remote();
    world.settings.repo.remote = Some(remote.display().to_string());
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let thread = ada.session.thread_id.clone();
    let worktree = world.settings.worktrees_dir().join(&thread);
    std::fs::write(worktree.join("FINDINGS.md"), "rounding twice\n").expect("write");
    let (status, body) = ada
        .session
        .call(
            "helpdesk.add_note",
            json!({"text": "The invoice total is rounded twice in src/invoice.rs."}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // What the model cost the session (the proxy's usage row, as it would write it).
    let (session_id, t) = (ada.session.id.clone(), thread.clone());
    app.db
        .write(move |c| {
            c.execute(
                "INSERT INTO model_usage (session_id, thread_id, turns_used, tokens_used) \
                 VALUES (?1, ?2, 3, 4567)",
                [&session_id, &t],
            )
        })
        .await
        .expect("usage");
    end(&app, &thread).await;

    // The branch is on the remote, at the local tip.
    let local = thread_tip(&world.settings.repo.path, &thread).expect("local branch");
    assert_eq!(thread_tip(&remote, &thread), Some(local));
    // One draft pull request from it into main, linking the thread and the finding.
    let pulls = world.github.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    let pull = &pulls[0];
    assert_eq!(pull["repo"], GITHUB_REPO);
    assert_eq!(pull["head"], format!("threadgate/{thread}"));
    assert_eq!(pull["base"], "main");
    assert_eq!(pull["draft"], true);
    let text = pull["body"].as_str().expect("body");
    assert!(
        text.contains(&format!(
            "https://app.plain.com/workspace/w_01FXQ6A83FXNN9XA00415VR1XP/thread/{thread}"
        )),
        "{text}"
    );
    assert!(text.contains("rounded twice in src/invoice.rs"), "{text}");
    // The thread's subject, the agent's findings quoted, every gated call with its
    // decision, the files changed and the cost.
    for expected in [
        "Subject: Invoice \\[total\\] is wrong\n",
        "> The invoice total is rounded twice in src/invoice.rs.\n",
        "## Gated calls (1)\n\n- helpdesk\\.add\\_note: ran\\, succeeded\n",
        "## Files changed (1)\n\n- added: FINDINGS\\.md\n",
        "3 model turns, 4567 tokens.",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // Support sees on the thread that an engineer has something to review.
    let url = pull["html_url"].as_str().expect("url").to_owned();
    world
        .note_containing(&thread, &url, "the pull request's note")
        .await;

    // The customer writes again, the agent changes more, the thread ends again: the
    // same pull request is updated, none is added.
    // (After the DONE, which is dated a second ahead: an older message reopens nothing.)
    let mut reopen: Value =
        serde_json::from_slice(&email_received(&thread, &plain_id("c"), "ada@example.com"))
            .expect("json");
    let at = (chrono::Utc::now() + chrono::Duration::seconds(2))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    reopen["timestamp"] = json!(at);
    let reopen = serde_json::to_vec(&reopen).expect("serialize");
    assert_eq!(app.send_webhook(&reopen).await, 200);
    let again = world.session_of(&app, &thread).await;
    std::fs::write(worktree.join("FIX.md"), "round once\n").expect("write");
    let (status, body) = again
        .call(
            "helpdesk.add_note",
            json!({"text": "Second look: the fix is to round once."}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    end(&app, &thread).await;
    let pulls = world.github.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0]["updates"], 1);
    // The new description replaces the old one: the latest finding, both calls, both
    // files; the first finding is no longer quoted.
    let text = pulls[0]["body"].as_str().expect("body");
    for expected in [
        "> Second look: the fix is to round once.\n",
        "## Gated calls (2)\n",
        "## Files changed (2)\n",
        "- added: FIX\\.md\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    assert!(!text.contains("> The invoice total"), "{text}");
    assert_eq!(text.matches("## What the agent found").count(), 1, "{text}");
    // One note for the pull request, not one per update.
    let notes = app.notes(&thread).await;
    let linking = notes.iter().filter(|n| n.contains(&url)).count();
    assert_eq!(linking, 1, "{notes:#?}");
    let local = thread_tip(&world.settings.repo.path, &thread).expect("local branch");
    assert_eq!(thread_tip(&remote, &thread), Some(local));

    // A session that changed nothing pushes nothing and opens nothing.
    let bob = world.customer_session(&app, "bob@example.com", &[]).await;
    end(&app, &bob.session.thread_id).await;
    assert_eq!(thread_tip(&remote, &bob.session.thread_id), None);
    assert_eq!(world.github.pulls().len(), 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_remote_the_branch_stays_local() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let thread = ada.session.thread_id.clone();
    let worktree = world.settings.worktrees_dir().join(&thread);
    std::fs::write(worktree.join("FINDINGS.md"), "rounding twice\n").expect("write");
    end(&app, &thread).await;
    let repo = git2::Repository::open(&world.settings.repo.path).expect("open");
    let tip = thread_tip(&world.settings.repo.path, &thread).expect("local branch");
    let tree = repo.find_commit(tip).expect("commit").tree().expect("tree");
    assert!(tree.get_name("FINDINGS.md").is_some());
    assert!(world.github.pulls().is_empty());
    assert!(world.github.requests().is_empty());
    app.stop().await;
}

/// Ends a session of a new thread that left a file, with `on_done` set; returns the
/// world, the app and the thread.
async fn ended_with(on_done: OnDone) -> (World, TestApp, String) {
    let mut world = World::new().await;
    world.settings.repo.remote = Some(world.bare_remote().display().to_string());
    world.settings.github.on_done = on_done;
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;
    let thread = ada.session.thread_id.clone();
    let worktree = world.settings.worktrees_dir().join(&thread);
    std::fs::write(worktree.join("FINDINGS.md"), "rounding twice\n").expect("write");
    end(&app, &thread).await;
    (world, app, thread)
}

/// The customer writes again (after the DONE, which is dated a second ahead), the
/// session goes on, leaves another file, and the thread is done again.
async fn follow_up_and_end(world: &World, app: &TestApp, thread: &str) {
    let mut reopen: Value =
        serde_json::from_slice(&email_received(thread, &plain_id("c"), "ada@example.com"))
            .expect("json");
    let at = (chrono::Utc::now() + chrono::Duration::seconds(2))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    reopen["timestamp"] = json!(at);
    let reopen = serde_json::to_vec(&reopen).expect("serialize");
    assert_eq!(app.send_webhook(&reopen).await, 200);
    world.session_of(app, thread).await;
    let worktree = world.settings.worktrees_dir().join(thread);
    std::fs::write(worktree.join("FIX.md"), "round once\n").expect("write");
    end(app, thread).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_done_ready_marks_the_pull_request_ready_for_review() {
    let (world, app, thread) = ended_with(OnDone::Ready).await;
    let pulls = world.github.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0]["draft"], false, "{pulls:#?}");
    assert_eq!(pulls[0]["state"], "open");
    let marks = |world: &World| {
        world
            .github
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/graphql")
            .count()
    };
    assert_eq!(marks(&world), 1);
    // After a follow-up it is updated and, being ready already, left as it is.
    follow_up_and_end(&world, &app, &thread).await;
    let pulls = world.github.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0]["updates"], 1);
    assert_eq!(marks(&world), 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_done_close_closes_it_and_a_follow_up_reopens_the_same_one() {
    let (world, app, thread) = ended_with(OnDone::Close).await;
    let pulls = world.github.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0]["state"], "closed");

    // A follow-up: the session goes on, ends again, and the one pull request is
    // reopened, updated and closed again, never duplicated.
    follow_up_and_end(&world, &app, &thread).await;
    let pulls = world.github.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0]["state"], "closed");
    let body = pulls[0]["body"].as_str().expect("body");
    assert!(body.contains("- added: FIX\\.md\n"), "{body}");
    let url = pulls[0]["html_url"].as_str().expect("url").to_owned();
    let notes = app.notes(&thread).await;
    assert_eq!(notes.iter().filter(|n| n.contains(&url)).count(), 1);
    app.stop().await;
}
