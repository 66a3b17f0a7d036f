//! Which threads this instance owns: the session leases it holds (see
//! [`crate::store::leases`]), acquired before it acts on a thread, renewed by a task of
//! their own, released when it has nothing of the thread left, and lost when another
//! instance took the thread over. A lost lease drops the session here (its container
//! stopped, its socket closed) without touching the database: the new owner's state is
//! not this instance's to write, and the database would refuse it anyway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::Supervisor;
use super::handle::{Msg, Outcome, lock};
use super::lifecycle::drop_local;
use crate::clock::Clock;
use crate::ids::ThreadId;
use crate::session::store;
use crate::store::Db;
use crate::store::leases::{self, Lease};
use crate::tasks::Tasks;

/// The leases this instance holds, shared by the actor and the renewal task.
pub(super) type Held = Arc<Mutex<HashMap<ThreadId, Lease>>>;

impl Supervisor {
    /// The lease this instance holds on `thread`, if any.
    pub(super) fn held(&self, thread: &ThreadId) -> Option<Lease> {
        lock(&self.leases).get(thread).cloned()
    }

    /// The lease on `thread`: the one this instance holds, or a fresh one when no one
    /// holds it (never had one, released, or expired: a takeover). `None` while another
    /// instance holds it, or when the database cannot say.
    pub(super) async fn lease_for(&mut self, thread: &ThreadId) -> Option<Lease> {
        if let Some(lease) = self.held(thread) {
            return Some(lease);
        }
        let (t, owner) = (thread.to_owned(), self.parts.instance_id.clone());
        let (now, lease_ms) = (self.now(), self.parts.settings.lease_ms());
        match self
            .parts
            .db
            .write(move |c| leases::acquire(c, &t, &owner, now, lease_ms))
            .await
        {
            Ok(Some(lease)) => {
                tracing::debug!(thread = %thread, token = lease.token, "acquired the session lease");
                lock(&self.leases).insert(thread.to_owned(), lease.clone());
                Some(lease)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::error!(thread = %thread, error = %e, "cannot acquire the session lease");
                None
            }
        }
    }

    /// Gives up `thread`'s lease when this instance has nothing of it left: no container
    /// slot and no operation in flight. A release that fails is logged; the lease then
    /// expires on its own.
    pub(super) async fn release_if_unused(&mut self, thread: &ThreadId) {
        if self.busy.contains_key(thread) || self.slots.contains(thread) {
            return;
        }
        let Some(lease) = lock(&self.leases).remove(thread) else {
            return;
        };
        if let Err(e) = self
            .parts
            .db
            .write(move |c| leases::release(c, &lease))
            .await
        {
            tracing::warn!(thread = %thread, error = %e, "cannot release the session lease; it expires");
        }
    }

    /// Releases every lease of a thread this instance has nothing of.
    pub(super) async fn release_unused(&mut self) {
        let threads: Vec<ThreadId> = lock(&self.leases).keys().cloned().collect();
        for thread in threads {
            self.release_if_unused(&thread).await;
        }
    }

    /// Another instance owns `thread` now (a fenced write or a renewal was refused):
    /// forget the lease and drop the session here. With an operation in flight, its
    /// report does the dropping (it finds no lease).
    pub(super) fn lease_lost(&mut self, thread: &ThreadId) {
        lock(&self.leases).remove(thread);
        tracing::warn!(thread = %thread, "the session lease went to another instance; dropping the session here");
        crate::metrics::reconcile("lease_lost", 1);
        if !self.busy.contains_key(thread) && self.slots.contains(thread) {
            self.spawn_drop(thread);
        }
    }

    /// The renewal task found `lease` refused: lost, unless the actor has moved on
    /// from it (released, or acquired again under another token).
    pub(super) fn renewal_refused(&mut self, lease: &Lease) {
        if self.held(&lease.thread_id).as_ref() == Some(lease) {
            self.lease_lost(&lease.thread_id);
        }
    }

    /// Stops this instance's containers of `thread` off the actor, without a database
    /// write; reports [`Outcome::Dropped`].
    pub(super) fn spawn_drop(&mut self, thread: &ThreadId) {
        self.busy.insert(thread.to_owned(), false);
        let parts = self.parts.clone();
        let tx = self.tx.clone();
        let thread = thread.to_owned();
        let span = tracing::info_span!("session_drop", thread_id = %thread);
        let drop_it = async move {
            if let Err(e) = drop_local(&parts, &thread).await {
                tracing::error!(error = %e, "cannot stop the container of a session owned elsewhere; reconcile retries");
            }
            let _ = tx.send(Msg::Done {
                thread,
                outcome: Outcome::Dropped,
            });
        };
        self.parts
            .tasks
            .spawn(tracing::Instrument::instrument(drop_it, span));
    }

    /// Runs a write under `thread`'s lease. A refusal by the lease's fence drops the
    /// session here ([`Supervisor::lease_lost`]); another failure is logged. `None` in
    /// both cases (and when this instance holds no lease on the thread).
    pub(super) async fn fenced<R, F>(&mut self, thread: &ThreadId, what: &str, f: F) -> Option<R>
    where
        R: Send + 'static,
        F: Fn(&crate::store::Conn<'_>, &Lease) -> crate::store::Result<R> + Send + Sync + 'static,
    {
        let Some(lease) = self.held(thread) else {
            self.lease_lost(thread);
            return None;
        };
        match self.parts.db.write(move |c| f(c, &lease)).await {
            Ok(value) => Some(value),
            Err(e) if leases::is_lost(&e) => {
                self.lease_lost(thread);
                None
            }
            Err(e) => {
                tracing::error!(thread = %thread, error = %e, "cannot {what}");
                None
            }
        }
    }

    /// At start: takes back, with fresh tokens, the leases an earlier run of this
    /// instance left (its sessions are adopted by the reconciliation that follows, and
    /// released if nothing of them is here).
    pub(super) async fn reclaim(&mut self) {
        let owner = self.parts.instance_id.clone();
        let (now, lease_ms) = (self.now(), self.parts.settings.lease_ms());
        match self
            .parts
            .db
            .write(move |c| leases::reclaim(c, &owner, now, lease_ms))
            .await
        {
            Ok(back) => {
                if !back.is_empty() {
                    tracing::info!(
                        leases = back.len(),
                        "took back the leases of this instance's earlier run"
                    );
                }
                let mut held = lock(&self.leases);
                for lease in back {
                    held.insert(lease.thread_id.clone(), lease);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot take back this instance's leases"),
        }
    }

    /// Takes over the live sessions no one owns (their owner died, or stopped and did
    /// not come back within the lease time): each is acquired and started in a fresh
    /// container here. The dead owner's container is never reached.
    pub(super) async fn take_over_unowned(&mut self) {
        let now = self.now();
        let unowned = match self
            .parts
            .db
            .read(move |c| store::unowned_live(c, now))
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the sessions without an owner; retried next tick");
                return;
            }
        };
        for row in unowned {
            let thread = row.thread_id.clone();
            if self.busy.contains_key(&thread)
                || self.slots.contains(&thread)
                || self.held(&thread).is_some()
            {
                continue;
            }
            if self.slots.len() >= self.parts.settings.max_live {
                break;
            }
            tracing::warn!(thread = %thread, "taking over a session whose owner stopped renewing its lease");
            crate::metrics::reconcile("taken_over", 1);
            self.try_start(row).await;
        }
    }
}

/// Renews every lease in `held` every `every` until shutdown
/// ([`leases::renew_all`]: a statement per lease); a renewal the database refuses is
/// reported to the actor as [`Msg::LeaseLost`]. A renewal that fails for another reason
/// is logged and tried again at the next round (the lease lasts three rounds).
pub(super) fn spawn_renewal(
    tasks: &Tasks,
    (db, clock): (Db, Clock),
    held: Held,
    tx: mpsc::UnboundedSender<Msg>,
    (every, lease_ms): (std::time::Duration, i64),
) {
    tasks.spawn_until_shutdown(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let leases: Vec<Lease> = lock(&held).values().cloned().collect();
            if leases.is_empty() {
                continue;
            }
            for lease in leases::renew_all(&db, leases, clock.now_ms(), lease_ms).await {
                if tx.send(Msg::LeaseLost(lease)).is_err() {
                    return;
                }
            }
        }
    });
}
