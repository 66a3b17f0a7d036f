//! Every task threadgate starts, owned by the application (mini-redis's shape): each is
//! spawned on one [`Tasks`] in the span it was started from, and shutdown drains them
//! with a deadline. The shutdown signal stops the loops that run for ever (outboxes,
//! the tick, the anchor, the sockets' accept loops); work in flight (an approved call
//! running, a container starting) finishes, or is cut at the deadline and logged. A cut
//! call is what a crash leaves: recovery picks it up at the next start.
//!
//! A leaf: it imports nothing of threadgate, so every module may start its work here.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

/// How long, once the deadline has cut the tasks left, shutdown waits for them to stop
/// (a task stops at its next await; a blocking one may not, and is left behind).
const CUT_GRACE: Duration = Duration::from_secs(1);

/// The application's tasks: a tracker of every task spawned, the shutdown signal the
/// long-running loops watch, and the cut that ends what is left at the deadline. Cheap
/// to clone; every clone spawns into the same set.
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    stopping: CancellationToken,
    cut: CancellationToken,
}

/// What [`Tasks::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Tasks still running at the deadline, cut there.
    pub cut: usize,
}

impl Tasks {
    /// An empty set.
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Runs `work` to its end, or until the shutdown deadline cuts it: work in flight
    /// that should finish (an approved call, a container starting or stopping). It runs
    /// in the current span.
    pub fn spawn<F>(&self, work: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cut = self.cut.clone();
        self.tracker.spawn(
            async move {
                tokio::select! {
                    biased;
                    () = cut.cancelled() => tracing::warn!("cut at the shutdown deadline"),
                    () = work => {}
                }
            }
            .in_current_span(),
        )
    }

    /// Runs `work`, a loop meant to run for as long as threadgate does, until the
    /// shutdown signal (an outbox, a tick, a sweep). It runs in the current span.
    pub fn spawn_until_shutdown<F>(&self, work: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stopping = self.stopping.clone();
        self.tracker.spawn(
            async move {
                tokio::select! {
                    biased;
                    () = stopping.cancelled() => {}
                    () = work => {}
                }
            }
            .in_current_span(),
        )
    }

    /// Runs blocking `work` on the blocking pool in the current span; the caller awaits
    /// the answer, so the task is owned by the caller's future.
    pub fn spawn_blocking<F, R>(work: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(work))
    }

    /// Resolves once shutdown has begun: what a listener's accept loop stops on.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        self.stopping.clone().cancelled_owned()
    }

    /// How many tasks are running.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Shuts down: signals the loops to stop, waits up to `deadline` for every task to
    /// end, then cuts what is left and logs how many.
    pub async fn shutdown(&self, deadline: Duration) -> Drained {
        self.tracker.close();
        self.stopping.cancel();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_ok()
        {
            tracing::info!("every task finished");
            return Drained { cut: 0 };
        }
        let cut = self.tracker.len();
        tracing::warn!(
            cut,
            deadline_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            "tasks still running at the shutdown deadline are cut"
        );
        self.cut.cancel();
        if tokio::time::timeout(CUT_GRACE, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = self.tracker.len(),
                "tasks did not stop when cut; leaving them"
            );
        }
        Drained { cut }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A task that sets its flag after `after`.
    fn finishes_after(tasks: &Tasks, after: Duration) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        tasks.spawn(async move {
            tokio::time::sleep(after).await;
            flag.store(true, Ordering::SeqCst);
        });
        done
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_work_in_flight_and_stops_the_loops() {
        let tasks = Tasks::new();
        let done = finishes_after(&tasks, Duration::from_secs(5));
        tasks.spawn_until_shutdown(std::future::pending());
        assert_eq!(tasks.len(), 2);
        let drained = tasks.shutdown(Duration::from_secs(30)).await;
        assert_eq!(drained, Drained { cut: 0 });
        assert!(
            done.load(Ordering::SeqCst),
            "the work finished before shutdown ended"
        );
        assert!(tasks.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn work_past_the_deadline_is_cut_and_counted() {
        let tasks = Tasks::new();
        let quick = finishes_after(&tasks, Duration::from_secs(1));
        let slow = finishes_after(&tasks, Duration::from_secs(120));
        let drained = tasks.shutdown(Duration::from_secs(10)).await;
        assert_eq!(drained, Drained { cut: 1 });
        assert!(quick.load(Ordering::SeqCst));
        assert!(!slow.load(Ordering::SeqCst), "the slow task was cut");
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn spawned_work_runs_in_the_span_it_was_spawned_from() {
        let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
        let tasks = Tasks::new();
        let span = tracing::info_span!("approval");
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let _entered = span.enter();
            tasks.spawn(async move {
                let _ = tx.send(tracing::Span::current().metadata().map(|m| m.name()));
            });
        }
        let seen = rx.await.expect("the task answers");
        assert_eq!(seen, Some("approval"));
    }
}
