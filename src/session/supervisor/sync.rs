//! Syncs: between checkpoints, a running session whose workspace lives in a pod has the
//! pod's work pulled into its worktree every [`PodSync::sync_every`] (when it changed;
//! the relay says so), without a commit. A pod that dies before its stop then loses at
//! most one period of work: the stop commits what the last sync brought.
//!
//! A sync is not an operation of the actor (the thread is not `busy`: events, a stop
//! or the agent's checkpoint are never held back by it). Instead each thread has a
//! worktree lock: a sync holds it while it pulls, and a checkpoint or a stop holds it
//! from its pull to the end of its commit, so a sync never writes the worktree while
//! one of them pulls into it or commits it. A sync that finds the lock held is skipped
//! (the checkpoint or stop pulls anyway); a checkpoint or stop waits for a sync to end.
//!
//! [`PodSync::sync_every`]: crate::session::PodSync::sync_every

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::Supervisor;
use crate::ids::ThreadId;
use crate::session::store::SessionState;

/// Each thread's worktree lock and when it was last synced (or checkpointed).
#[derive(Default)]
pub(super) struct Syncs {
    locks: HashMap<ThreadId, Arc<Mutex<()>>>,
    last_ms: HashMap<ThreadId, i64>,
}

impl Syncs {
    /// The thread's worktree lock, made on first use.
    pub(super) fn lock_of(&mut self, thread: &ThreadId) -> Arc<Mutex<()>> {
        self.locks.entry(thread.clone()).or_default().clone()
    }

    /// Records a checkpoint: the next sync is due a period after it.
    pub(super) fn synced(&mut self, thread: &ThreadId, now: i64) {
        self.last_ms.insert(thread.clone(), now);
    }
}

impl Supervisor {
    /// The tick's syncs: every running session not busy whose last sync or checkpoint
    /// is a period old, unless its worktree lock is held.
    pub(super) async fn syncs_due(&mut self) {
        let slots = &self.slots;
        self.syncs.locks.retain(|t, _| slots.contains(t));
        self.syncs.last_ms.retain(|t, _| slots.contains(t));
        let Some(pods) = self.parts.pod_sync.clone() else {
            return;
        };
        let Some(every) = pods.sync_every() else {
            return;
        };
        let every = crate::clock::ms(every);
        let now = self.now();
        let last_ms = &mut self.syncs.last_ms;
        let due: Vec<ThreadId> = self
            .slots
            .iter()
            .filter(|t| !self.busy.contains_key(*t))
            .filter(|t| now - *last_ms.entry((*t).clone()).or_insert(now) >= every)
            .cloned()
            .collect();
        for thread in due {
            self.syncs.last_ms.insert(thread.clone(), now);
            let Ok(held) = self.syncs.lock_of(&thread).try_lock_owned() else {
                continue;
            };
            let Some(row) = self.session(&thread).await else {
                continue;
            };
            if row.state != SessionState::Running {
                continue;
            }
            let pods = pods.clone();
            let span = tracing::debug_span!("session_sync", thread_id = %row.thread_id, session_id = %row.session_id);
            let work = async move {
                if let Err(e) = pods.sync(&row.session_id).await {
                    tracing::warn!(error = %format!("{e:#}"), "cannot sync the pod's workspace; tried again next period");
                }
                drop(held);
            };
            self.parts
                .tasks
                .spawn(tracing::Instrument::instrument(work, span));
        }
    }
}

/// Holds `lock` for the work that follows (a checkpoint's, a stop's).
pub(super) async fn hold(lock: Arc<Mutex<()>>) -> OwnedMutexGuard<()> {
    lock.lock_owned().await
}
