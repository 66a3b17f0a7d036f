//! Which threads this instance owns: the session leases it holds (see
//! [`crate::store::leases`]), acquired before it acts on a thread, renewed by a task of
//! their own, released when it has nothing of the thread left, and lost when another
//! instance took the thread over. A lost lease drops the session here (its container
//! stopped, its socket closed) without touching the database: the new owner's state is
//! not this instance's to write, and the database would refuse it anyway.
//!
//! A lease whose renewals do not get through (the database slow or out of reach, this
//! process starved of a core) is given up here before it can expire: each lease is
//! known valid until the instant its last acquire or renewal began plus the lease
//! time (the database's expiry is counted from no earlier), and once less than a
//! quarter of the lease time is left of that, the session is dropped as if the lease
//! were lost ([`spawn_lapse_watch`]). Another instance may take the thread over only
//! after the expiry, so by then this one has stopped its container: never two
//! containers of one thread at once, even when this instance cannot renew.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Supervisor;
use super::handle::{Msg, Outcome, lock};
use super::lifecycle::drop_local;
use super::parts::SupervisorParts;
use crate::clock::Clock;
use crate::ids::ThreadId;
use crate::session::store;
use crate::store::Db;
use crate::store::leases::{self, Lease};
use crate::tasks::Tasks;

/// The leases this instance holds, shared by the actor, the renewal task and the lapse
/// watch.
pub(super) type Held = Arc<Mutex<HashMap<ThreadId, HeldLease>>>;

/// A lease this instance holds, and until when it is known valid here.
#[derive(Debug, Clone)]
pub(super) struct HeldLease {
    pub lease: Lease,
    /// The instant its last acquire or renewal began, plus the lease time: the
    /// database's expiry is that statement's time plus the lease time, read after it.
    pub valid_until: Instant,
}

impl HeldLease {
    /// `lease`, acquired or renewed by a statement begun at `asked`.
    pub(super) fn new(lease: Lease, asked: Instant, lease_time: Duration) -> HeldLease {
        HeldLease {
            lease,
            valid_until: asked + lease_time,
        }
    }
}

/// How much of a lease's validity must be left for this instance to go on acting under
/// it: a quarter of the lease time, the time it has to stop the session's container
/// before another instance may take the thread over.
pub(super) fn lapse_margin(lease_time: Duration) -> Duration {
    lease_time / 4
}

/// How often the lapse watch looks: a fifth of the margin, between 10 and 250 ms, so a
/// lapsing lease is seen with most of its margin left.
pub(super) fn lapse_watch_every(lease_time: Duration) -> Duration {
    (lapse_margin(lease_time) / 5).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

impl Supervisor {
    /// The lease this instance holds on `thread`, if any.
    pub(super) fn held(&self, thread: &ThreadId) -> Option<Lease> {
        lock(&self.leases).get(thread).map(|h| h.lease.clone())
    }

    /// The lease on `thread`: the one this instance holds, or a fresh one when no one
    /// holds it (never had one, released, or expired: a takeover). `None` while another
    /// instance holds it, or when the database cannot say.
    pub(super) async fn lease_for(&mut self, thread: &ThreadId) -> Option<Lease> {
        if let Some(lease) = self.held(thread) {
            return Some(lease);
        }
        let (t, owner) = (thread.to_owned(), self.parts.instance_id.clone());
        let asked = Instant::now();
        let (now, lease_ms) = (self.now(), self.parts.settings.lease_ms());
        match self
            .parts
            .db
            .write(move |c| leases::acquire(c, &t, &owner, now, lease_ms))
            .await
        {
            Ok(Some(lease)) => {
                tracing::debug!(thread = %thread, token = lease.token, "acquired the session lease");
                let held = HeldLease::new(lease.clone(), asked, self.parts.settings.lease_time);
                lock(&self.leases).insert(thread.to_owned(), held);
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
        let Some(HeldLease { lease, .. }) = lock(&self.leases).remove(thread) else {
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
        tracing::warn!(thread = %thread, "the session lease went to another instance; dropping the session here");
        crate::metrics::reconcile("lease_lost", 1);
        self.give_up(thread);
    }

    /// Forgets `thread`'s lease and drops its session here (with an operation in
    /// flight, its report does the dropping: it finds no lease).
    fn give_up(&mut self, thread: &ThreadId) {
        lock(&self.leases).remove(thread);
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

    /// The lapse watch gave `lease` up (taken out of the held leases, its containers
    /// stopped off the actor, the lease released): the actor drops what it keeps of
    /// the session (its slot), unless the thread has a lease here again (a new
    /// session there, not to be touched) or an operation in flight (its report does it).
    pub(super) fn lease_lapsed(&mut self, lease: &Lease) {
        let thread = &lease.thread_id;
        if self.held(thread).is_none()
            && !self.busy.contains_key(thread)
            && self.slots.contains(thread)
        {
            self.spawn_drop(thread);
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
        let asked = Instant::now();
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
                let lease_time = self.parts.settings.lease_time;
                let mut held = lock(&self.leases);
                for lease in back {
                    let thread = lease.thread_id.clone();
                    held.insert(thread, HeldLease::new(lease, asked, lease_time));
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
/// ([`leases::renew_all`]: a statement per lease), each renewed lease's validity moved
/// on as its statement commits; a renewal the database refuses is reported to the actor
/// as [`Msg::LeaseLost`]. Each round runs as a task of its own and skips the leases a
/// round before it is still renewing: one renewal stuck on its row (a decision holding
/// it, a slow database) delays that lease only, never the next rounds of the others. A
/// renewal that fails for another reason is tried again at the next round (the lease
/// lasts three rounds).
pub(super) fn spawn_renewal(
    tasks: &Tasks,
    (db, clock): (Db, Clock),
    held: Held,
    tx: mpsc::UnboundedSender<Msg>,
    (every, lease_time): (Duration, Duration),
) {
    let lease_ms = crate::clock::ms(lease_time);
    let rounds = tasks.clone();
    let renewing: Arc<Mutex<HashSet<ThreadId>>> = Arc::default();
    tasks.spawn_until_shutdown(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let leases: Vec<Lease> = {
                let mut renewing = lock(&renewing);
                lock(&held)
                    .values()
                    .filter(|h| renewing.insert(h.lease.thread_id.clone()))
                    .map(|h| h.lease.clone())
                    .collect()
            };
            if leases.is_empty() {
                continue;
            }
            let (db, held, renewing, tx) = (db.clone(), held.clone(), renewing.clone(), tx.clone());
            let now_ms = clock.now_ms();
            // Before the time the statements carry: the database's expiry is no earlier.
            let asked = Instant::now();
            rounds.spawn(async move {
                let done = |lease: &Lease, renewed: bool| {
                    lock(&renewing).remove(&lease.thread_id);
                    if renewed
                        && let Some(h) = lock(&held).get_mut(&lease.thread_id)
                        && h.lease == *lease
                    {
                        h.valid_until = asked + lease_time;
                    }
                };
                for lease in leases::renew_all(&db, leases, now_ms, lease_ms, done).await {
                    let _ = tx.send(Msg::LeaseLost(lease));
                }
            });
        }
    });
}

/// Watches the validity of every lease in `held`, every `every`, and gives up here,
/// off the actor (which may itself be waiting on the slow database), each with less
/// than `margin` of it left ([`lapsing`]): taken out of `held` at once (nothing here
/// acts under it any more), its thread's containers stopped and its socket closed
/// (`drop_local`), then the lease released so another instance need not wait for its
/// expiry; the actor is told ([`Msg::LeaseLapsing`]) to drop its own record of the
/// session.
pub(super) fn spawn_lapse_watch(
    parts: Arc<SupervisorParts>,
    held: Held,
    tx: mpsc::UnboundedSender<Msg>,
    (every, margin): (Duration, Duration),
) {
    let tasks = parts.tasks.clone();
    tasks.clone().spawn_until_shutdown(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let due = lapsing(&mut lock(&held), Instant::now(), margin);
            for lease in due {
                tracing::warn!(thread = %lease.thread_id, token = lease.token, "the session lease could not be renewed in time; dropping the session here before it expires");
                crate::metrics::reconcile("lease_lapsed", 1);
                let (parts, tx) = (parts.clone(), tx.clone());
                tasks.spawn(async move {
                    if let Err(e) = drop_local(&parts, &lease.thread_id).await {
                        tracing::error!(thread = %lease.thread_id, error = %e, "cannot stop the container of a lapsing lease; reconcile retries");
                    }
                    let release = lease.clone();
                    if let Err(e) = parts.db.write(move |c| leases::release(c, &release)).await {
                        tracing::warn!(thread = %lease.thread_id, error = %e, "cannot release a lapsed lease; it expires");
                    }
                    let _ = tx.send(Msg::LeaseLapsing(lease));
                });
            }
        }
    });
}

/// Takes out of `held` the leases with less than `margin` of their validity left at
/// `now`, and answers them.
pub(super) fn lapsing(
    held: &mut HashMap<ThreadId, HeldLease>,
    now: Instant,
    margin: Duration,
) -> Vec<Lease> {
    let due: Vec<ThreadId> = held
        .iter()
        .filter(|(_, h)| h.valid_until <= now + margin)
        .map(|(thread, _)| thread.clone())
        .collect();
    due.iter()
        .filter_map(|thread| held.remove(thread).map(|h| h.lease))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(thread: &str, token: i64) -> Lease {
        Lease {
            thread_id: ThreadId::parse(thread).expect("thread id"),
            owner: "inst".into(),
            token,
        }
    }

    /// A lease is given up once it has less than the margin of its validity left (and
    /// so only once: it leaves the held leases); one renewed meanwhile (its validity
    /// moved on) is not.
    #[test]
    fn a_lease_is_given_up_with_less_than_the_margin_left() {
        let lease_time = Duration::from_secs(4);
        let margin = lapse_margin(lease_time);
        assert_eq!(margin, Duration::from_secs(1));
        let start = Instant::now();
        let mut held = HashMap::new();
        for (thread, asked_after) in [("th_a", 0), ("th_b", 2)] {
            let asked = start + Duration::from_secs(asked_after);
            let held_lease = HeldLease::new(lease(thread, 1), asked, lease_time);
            held.insert(ThreadId::parse(thread).expect("id"), held_lease);
        }
        // 2.9 s in: th_a is valid until 4 s, more than the margin left.
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert!(lapsing(&mut held, at(2_900), margin).is_empty());
        // 3 s in: th_a has the margin left and is given up; th_b (until 6 s) is not.
        assert_eq!(
            lapsing(&mut held, at(3_000), margin),
            vec![lease("th_a", 1)]
        );
        assert_eq!(held.len(), 1, "th_a left the held leases");
        assert!(lapsing(&mut held, at(3_500), margin).is_empty());
        // th_b renewed at 4 s (valid until 8 s): not given up at 5 s.
        let th_b = ThreadId::parse("th_b").expect("id");
        held.get_mut(&th_b).expect("th_b").valid_until = at(8_000);
        assert!(lapsing(&mut held, at(5_000), margin).is_empty());
        assert_eq!(
            lapsing(&mut held, at(7_000), margin),
            vec![lease("th_b", 1)]
        );
        assert!(held.is_empty());
    }
}
