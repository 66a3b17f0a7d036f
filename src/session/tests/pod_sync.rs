//! Syncs of a pod's workspace through the actor: taken every period while a session
//! runs, never committing, and never at the same time as a checkpoint's or a stop's
//! pull and commit of the thread (a checkpoint asked during a sync waits for it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::{FakeWorkspaces, Harness, harness_with_pods, tid};
use crate::ids::SessionId;
use crate::session::{PodSync, SessionState};

/// A pod whose syncs take a while, counting what overlaps.
#[derive(Default)]
struct SlowPods {
    workspaces: std::sync::OnceLock<Arc<FakeWorkspaces>>,
    syncs: AtomicUsize,
    pulls: AtomicUsize,
    in_flight: AtomicUsize,
    overlapped: AtomicBool,
}

impl SlowPods {
    async fn work(&self, wait: Duration) {
        let committing = self
            .workspaces
            .get()
            .is_some_and(|w| w.in_commit.load(Ordering::SeqCst) > 0);
        if self.in_flight.fetch_add(1, Ordering::SeqCst) > 0 || committing {
            self.overlapped.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(wait).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl PodSync for SlowPods {
    async fn pull(&self, _: &SessionId) -> anyhow::Result<bool> {
        self.pulls.fetch_add(1, Ordering::SeqCst);
        self.work(Duration::from_millis(50)).await;
        Ok(true)
    }

    fn forget(&self, _: &SessionId) {}

    async fn sync(&self, _: &SessionId) -> anyhow::Result<bool> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.work(Duration::from_millis(1_500)).await;
        Ok(true)
    }

    fn sync_every(&self) -> Option<Duration> {
        Some(Duration::from_secs(5))
    }
}

fn commits(h: &Harness) -> usize {
    h.workspaces
        .log()
        .iter()
        .filter(|l| l.starts_with("commit "))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_runs_every_period_and_never_beside_a_checkpoint() {
    let pods = Arc::new(SlowPods::default());
    let h = harness_with_pods(pods.clone());
    let _ = pods.workspaces.set(h.workspaces.clone());
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    // The tick first notes the session; a period later it syncs.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(pods.syncs.load(Ordering::SeqCst), 0);
    h.now.fetch_add(6_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(pods.syncs.load(Ordering::SeqCst), 1, "a sync is in flight");

    // The agent asks for a checkpoint while the sync runs: it waits for the sync, then
    // pulls and commits; the thread was never busy, so nothing was refused.
    let checkpoint = h.handle.checkpoint(&tid("th_1")).await;
    assert!(checkpoint.is_ok(), "{checkpoint:?}");
    assert_eq!(pods.pulls.load(Ordering::SeqCst), 1);
    assert_eq!(commits(&h), 1, "only the checkpoint commits");
    assert!(
        !pods.overlapped.load(Ordering::SeqCst),
        "a sync overlapped a pull or commit"
    );

    // A stop asked while the next sync runs waits for it too.
    h.now.fetch_add(6_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(pods.syncs.load(Ordering::SeqCst), 2);
    h.event("th_1", "done", 2_000).await;
    for _ in 0..100 {
        if h.state("th_1").await == Some(SessionState::Ended) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert_eq!(pods.pulls.load(Ordering::SeqCst), 2, "the stop pulled");
    assert!(
        !pods.overlapped.load(Ordering::SeqCst),
        "a sync overlapped a pull or commit"
    );
}
