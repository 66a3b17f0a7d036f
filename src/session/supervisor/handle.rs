//! The supervisor's mailbox: the messages it serves and the cheap handle the rest of
//! threadgate sends them through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::clock::Clock;
use crate::ids::ThreadId;
use crate::session::SessionError;
use crate::store::leases::Lease;

/// A message to the actor; it serves them one at a time.
pub(super) enum Msg {
    /// New events (or a decision on a held call) for a thread.
    Thread(ThreadId),
    /// A spawned operation finished.
    Done {
        thread: ThreadId,
        outcome: Outcome,
    },
    /// A decision came for a session's held call.
    Resume(ThreadId),
    /// An operator stops a thread's session.
    Stop {
        thread: ThreadId,
        reply: oneshot::Sender<Result<(), SessionError>>,
    },
    /// Stops a thread's session without anyone waiting for the answer (a session the
    /// gate or the model proxy stopped on its own); a failure is logged with `why`.
    StopSoon {
        thread: ThreadId,
        why: &'static str,
    },
    /// The agent asks for a checkpoint of its session (`checkpoint.rs`).
    Checkpoint {
        thread: ThreadId,
        reply: super::checkpoint_answer::Reply,
    },
    /// Answer once no operation is in flight and no message is waiting.
    WhenQuiet(oneshot::Sender<()>),
    Tick,
    Reconcile,
    /// The renewal task (or a fenced write of the gate or the model proxy) found this
    /// lease refused by the database.
    LeaseLost(Lease),
    /// The lapse watch gave this lease up before it could expire unrenewed (its
    /// containers stopped, the lease released): the actor drops its record of the
    /// session.
    LeaseLapsing(Lease),
    /// Stop serving; containers stay and are adopted by the next start.
    Shutdown,
}

/// What a spawned start or stop reports back to the actor.
pub(super) enum Outcome {
    Started {
        container_id: String,
        worktree: String,
    },
    StartFailed(String),
    /// The container is gone and the work committed; `ended` says whether the session
    /// ended or only went idle.
    Stopped {
        ended: bool,
    },
    StopFailed(String),
    /// A checkpoint finished; `push` is `None` when its commit failed.
    Checkpointed {
        push: Option<super::checkpoint_answer::PushState>,
    },
    /// The thread's lease went to another instance: this instance's containers of it
    /// are stopped, and nothing was written.
    Dropped,
}

/// A cheap handle for the rest of threadgate to talk to the supervisor.
#[derive(Clone)]
pub struct SupervisorHandle {
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) activity: Arc<Mutex<HashMap<ThreadId, i64>>>,
    pub(super) feed: broadcast::Sender<ThreadId>,
    pub(super) clock: Clock,
}

impl SupervisorHandle {
    /// Tells the supervisor a thread has new events or a decision.
    pub fn thread_changed(&self, thread_id: &ThreadId) {
        // A send fails only once the supervisor has stopped, when nothing is to be done.
        let _ = self.tx.send(Msg::Thread(thread_id.clone()));
    }

    /// Records that a session's agent did something (not merely waited).
    pub fn touch(&self, thread_id: &ThreadId) {
        let now = self.clock.now_ms();
        lock(&self.activity).insert(thread_id.clone(), now);
    }

    /// Thread ids whose feed gained events.
    pub fn subscribe_feed(&self) -> broadcast::Receiver<ThreadId> {
        self.feed.subscribe()
    }

    /// Stops a thread's session: container removed, work committed, worktree removed.
    pub async fn stop(&self, thread_id: &ThreadId) -> Result<(), SessionError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Stop {
                thread: thread_id.clone(),
                reply,
            })
            .map_err(|_| SessionError::Stopped)?;
        rx.await.map_err(|_| SessionError::Stopped)?
    }

    /// Asks the supervisor to stop a thread's session and returns at once: for a part
    /// that stops a session on its own and has no one to answer (`why` is logged if the
    /// stop fails).
    pub fn stop_soon(&self, thread_id: &ThreadId, why: &'static str) {
        // A send fails only once the supervisor has stopped, when nothing is to be done.
        let _ = self.tx.send(Msg::StopSoon {
            thread: thread_id.clone(),
            why,
        });
    }

    /// Resumes a session that gave up its container while it waited for a person, now
    /// that the decision has come.
    pub fn resume(&self, thread_id: &ThreadId) {
        let _ = self.tx.send(Msg::Resume(thread_id.clone()));
    }

    /// A write made for a session under `lease` was refused by the lease's fence: the
    /// thread went to another instance, and the session is dropped here (as when a
    /// renewal is refused) without waiting for the next renewal.
    pub fn lease_refused(&self, lease: &Lease) {
        let _ = self.tx.send(Msg::LeaseLost(lease.clone()));
    }

    /// Runs a reconciliation now.
    pub fn reconcile(&self) {
        let _ = self.tx.send(Msg::Reconcile);
    }

    /// Stops the supervisor (at shutdown). Running containers stay; the next start of
    /// threadgate adopts them.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Msg::Shutdown);
    }

    /// Waits until the supervisor has no operation in flight.
    pub async fn quiet(&self) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Msg::WhenQuiet(reply)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Locks `m`, taking the value over if a panicking holder poisoned it.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
