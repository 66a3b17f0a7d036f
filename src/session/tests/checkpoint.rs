//! Checkpoints through the actor: taken every period while a session runs and when its
//! agent asks (not too often, not while another operation is in flight), and never at
//! the same time as the session's stop, which waits for the checkpoint and then commits
//! once more.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Harness, harness, harness_checkpointing, tid};
use crate::sandbox::FakeRuntime;
use crate::session::{CheckpointError, PushState, SessionState};

fn commits(h: &Harness, thread: &str) -> usize {
    let line = format!("commit {thread}");
    h.workspaces.log().iter().filter(|l| **l == line).count()
}

/// Lets a few ticks (every 500 ms of real time) run, then waits for quiet.
async fn ticks(h: &Harness) {
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    h.settle().await;
}

#[tokio::test]
async fn a_running_session_is_checkpointed_every_period() {
    let h = harness_checkpointing(
        4,
        Arc::new(FakeRuntime::new()),
        None,
        Duration::from_secs(30),
    );
    h.event("th_1", "customer", 1_000).await;
    // The tick first notes when it sees the session run; no checkpoint yet.
    ticks(&h).await;
    assert_eq!(commits(&h, "th_1"), 0);
    h.now.fetch_add(31_000, Ordering::SeqCst);
    ticks(&h).await;
    assert_eq!(commits(&h, "th_1"), 1, "{:?}", h.workspaces.log());
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    assert_eq!(h.running_containers().await, 1, "the container goes on");
    // Not again within the period.
    ticks(&h).await;
    assert_eq!(commits(&h, "th_1"), 1);
}

#[tokio::test]
async fn a_zero_period_takes_no_periodic_checkpoint() {
    let h = harness_checkpointing(4, Arc::new(FakeRuntime::new()), None, Duration::ZERO);
    h.event("th_1", "customer", 1_000).await;
    ticks(&h).await;
    h.now.fetch_add(50_000, Ordering::SeqCst);
    ticks(&h).await;
    assert_eq!(commits(&h, "th_1"), 0);
}

#[tokio::test]
async fn the_agent_asks_for_a_checkpoint_at_most_every_ten_seconds() {
    let h = harness(4);
    let thread = tid("th_1");
    assert_eq!(
        h.handle.checkpoint(&thread).await,
        Err(CheckpointError::NotRunning),
        "no session yet"
    );
    h.event("th_1", "customer", 1_000).await;
    let done = h.handle.checkpoint(&thread).await.expect("checkpoint");
    assert_eq!(done.branch, "threadgate/th_1");
    assert_eq!(done.push, PushState::NoRemote);
    assert_eq!(commits(&h, "th_1"), 1);

    let again = h.handle.checkpoint(&thread).await;
    assert_eq!(
        again,
        Err(CheckpointError::TooSoon {
            retry_after_ms: 10_000
        })
    );
    assert_eq!(
        commits(&h, "th_1"),
        1,
        "a refused checkpoint commits nothing"
    );
    h.now.fetch_add(10_000, Ordering::SeqCst);
    h.handle.checkpoint(&thread).await.expect("checkpoint");
    assert_eq!(commits(&h, "th_1"), 2);
}

#[tokio::test]
async fn a_stop_that_races_a_checkpoint_waits_for_it_and_commits_once_after() {
    let h = harness(4);
    let thread = tid("th_1");
    h.event("th_1", "customer", 1_000).await;
    h.workspaces.hold_commits(true);
    let asked = {
        let handle = h.handle.clone();
        let thread = thread.clone();
        tokio::spawn(async move { handle.checkpoint(&thread).await })
    };
    // The checkpoint's commit has begun and waits.
    for _ in 0..1_000 {
        if commits(&h, "th_1") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if asked.is_finished() {
        panic!(
            "answered before committing: {:?}; state {:?}",
            asked.await,
            h.state("th_1").await
        );
    }
    assert_eq!(commits(&h, "th_1"), 1);

    // DONE and an operator's stop arrive meanwhile; another checkpoint is refused.
    h.now.fetch_add(20_000, Ordering::SeqCst);
    h.handle.stop(&thread).await.expect("stop is recorded");
    assert_eq!(
        h.handle.checkpoint(&thread).await,
        Err(CheckpointError::Busy)
    );
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    assert_eq!(h.running_containers().await, 1, "nothing stopped yet");

    h.workspaces.hold_commits(false);
    let done = asked.await.expect("join").expect("checkpoint");
    assert_eq!(done.commit, None);
    ticks(&h).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert_eq!(h.running_containers().await, 0);
    assert_eq!(
        h.workspaces.log(),
        vec![
            "prepare th_1",
            "commit th_1",
            "commit th_1",
            "diff th_1",
            "remove th_1"
        ],
        "the checkpoint's commit, then the stop's, once each"
    );
    assert_eq!(
        h.workspaces.most_in_commit.load(Ordering::SeqCst),
        1,
        "two commits of one worktree never ran at once"
    );
    // An ended session takes no checkpoint.
    assert_eq!(
        h.handle.checkpoint(&thread).await,
        Err(CheckpointError::NotRunning)
    );
}
