//! Slots capped per session and per instance: what lets a session use a shared
//! resource of the instance only so much at once.
//!
//! Two kinds of work take them ([`super::gate::Gate`] holds one [`SessionSlots`] each):
//!
//! - **Trailing outcomes.** A read decided on a snapshot (`read_call`) is answered once
//!   its decision is durable; its outcome (status and `ran` step, committed without
//!   waiting for the log's flush) is then written by a task of its own, off the
//!   answer's path. Each such task holds a [`Slot`]: at most [`PER_SESSION`] of one
//!   session and [`IN_ALL`] of the whole instance trail at once. A read that finds no
//!   slot free writes its outcome before it answers, as every other call does, so a
//!   session that floods reads waits on its own outcomes and memory holds at most
//!   [`IN_ALL`] of them, whatever the agents send. An outcome that trails is what a
//!   crash may lose, as an unflushed one already was: the row stays `running` and
//!   recovery re-sends the read. A clean stop waits for the tasks (they run on the
//!   application's `Tasks`), and [`SessionSlots::settled`] waits for those in flight
//!   now (what a test that reads a row right after its read waits on).
//! - **Waits on an identical call in flight** (`run::await_twin`): at most
//!   `gate::TWIN_WAITS_PER_SESSION` of one session; one past the cap is answered at once
//!   from the twin as it stands.
//! - **Calls under way** (`Gate::call_to_the_end`): every call of the sandbox API and
//!   of MCP holds a slot from before it is checked until its outcome is recorded,
//!   whether its client still waits or hung up. A session's socket caps its
//!   connections, but a call whose client hung up runs on to its end without one, so
//!   without this cap an agent that hangs up and calls again could keep any number of
//!   calls on their way to the providers. At most `GateParts::max_calls_per_session`
//!   of one session (twice the socket's connection cap: the socket's and the relayed
//!   connections are counted apart, so an agent that waits for its answers never meets
//!   it) and `GateParts::max_calls_in_all` of the instance (that cap times `[sessions]
//!   max_live`, at least `gate::CALLS_IN_ALL`); one past it is refused
//!   `too_many_calls` (`instance_busy`), recorded and sent nowhere.
//!
//! - **MCP waits** (`threadgate_wait` and a redeemed request state, `mcp::handler`): rmcp
//!   runs each request's handler on a task of its own, so a wait whose client hung up
//!   is ended by the request's cancellation, not by the connection; the caps (the
//!   calls' caps above) bound them should that ever not come.
//!
//! A slot is freed when it is dropped, whether its work succeeded or not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::ids::SessionId;

/// Slots of one session at most, unless a holder is made with other caps.
pub const PER_SESSION: usize = 8;
/// Slots taken at most on this instance, all sessions together.
pub const IN_ALL: usize = 256;

/// The slots taken now, by session (see the module docs).
#[derive(Debug)]
pub struct SessionSlots {
    state: Mutex<State>,
    /// Woken whenever a session's last slot is freed.
    idle: Notify,
    per_session: usize,
    in_all: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Only sessions with an outcome trailing: an entry goes with its last slot.
    by_session: HashMap<SessionId, usize>,
    total: usize,
}

/// Which cap refused a slot, with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The session holds as many slots as one session may.
    Session(usize),
    /// The instance holds as many slots as it may, all sessions together.
    Instance(usize),
}

/// One unit of work's place; freed when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<SessionSlots>,
    session_id: SessionId,
}

impl Default for SessionSlots {
    fn default() -> Self {
        SessionSlots::with_caps(PER_SESSION, IN_ALL)
    }
}

impl SessionSlots {
    /// With caps other than the defaults (tests).
    pub fn with_caps(per_session: usize, in_all: usize) -> SessionSlots {
        SessionSlots {
            state: Mutex::default(),
            idle: Notify::new(),
            per_session,
            in_all,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for one more unit of work of `session_id`, or `None` when the session or
    /// the instance is at its cap.
    pub fn take(self: &Arc<Self>, session_id: &SessionId) -> Option<Slot> {
        self.try_take(session_id).ok()
    }

    /// [`SessionSlots::take`], saying which cap refused it.
    pub fn try_take(self: &Arc<Self>, session_id: &SessionId) -> Result<Slot, Full> {
        let mut state = self.state();
        if state.total >= self.in_all {
            return Err(Full::Instance(self.in_all));
        }
        if state.by_session.get(session_id).copied().unwrap_or(0) >= self.per_session {
            return Err(Full::Session(self.per_session));
        }
        *state.by_session.entry(session_id.clone()).or_insert(0) += 1;
        state.total += 1;
        Ok(Slot {
            slots: self.clone(),
            session_id: session_id.clone(),
        })
    }

    /// Slots of one session at most.
    pub fn per_session(&self) -> usize {
        self.per_session
    }

    /// Slots of the instance at most.
    pub fn in_all(&self) -> usize {
        self.in_all
    }

    /// How many slots are taken now.
    pub fn len(&self) -> usize {
        self.state().total
    }

    /// Whether no slot is taken now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once no slot is taken (at once if none is).
    pub async fn settled(&self) {
        self.settled_when(|state| state.total == 0).await;
    }

    /// Resolves once `session_id` holds no slot, whatever other sessions do.
    pub async fn session_settled(&self, session_id: &str) {
        self.settled_when(|state| !state.by_session.contains_key(session_id))
            .await;
    }

    async fn settled_when(&self, done: impl Fn(&State) -> bool) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Registered before the check: a wake between the two is not missed.
            idle.as_mut().enable();
            if done(&self.state()) {
                return;
            }
            idle.await;
        }
    }

    fn free(&self, session_id: &SessionId) {
        let mut state = self.state();
        if let Some(n) = state.by_session.get_mut(session_id) {
            *n -= 1;
            if *n == 0 {
                state.by_session.remove(session_id);
                // A session settled (and the instance, once the last one did).
                self.idle.notify_waiters();
            }
        }
        state.total -= 1;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.free(&self.session_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u32) -> SessionId {
        SessionId::parse(format!("sess_{n:026}")).expect("a session id")
    }

    #[test]
    fn a_session_trails_at_most_its_cap_and_gets_its_slots_back() {
        let trailing = Arc::new(SessionSlots::with_caps(3, 100));
        let (a, b) = (session(1), session(2));
        let held: Vec<Slot> = (0..3).map(|_| trailing.take(&a).expect("a slot")).collect();
        assert!(trailing.take(&a).is_none(), "a fourth of one session");
        assert!(
            trailing.take(&b).is_some(),
            "another session is not held back"
        );
        assert_eq!(trailing.len(), 3, "b's slot was freed when dropped");
        drop(held);
        assert!(trailing.is_empty());
        assert!(
            trailing.state().by_session.is_empty(),
            "no entry outlives its slots"
        );
        assert!(trailing.take(&a).is_some(), "freed slots are taken again");
    }

    #[test]
    fn a_refused_slot_says_which_cap_refused_it() {
        let slots = Arc::new(SessionSlots::with_caps(2, 3));
        let (a, b) = (session(1), session(2));
        let _held = [slots.try_take(&a), slots.try_take(&a), slots.try_take(&b)];
        assert_eq!(slots.try_take(&a).err(), Some(Full::Instance(3)));
        let slots = Arc::new(SessionSlots::with_caps(2, 30));
        let _held = [slots.try_take(&a), slots.try_take(&a)];
        assert_eq!(slots.try_take(&a).err(), Some(Full::Session(2)));
        assert!(
            slots.try_take(&b).is_ok(),
            "another session is not held back"
        );
    }

    #[test]
    fn a_session_refused_a_slot_leaves_no_entry_behind() {
        let trailing = Arc::new(SessionSlots::with_caps(0, 10));
        assert!(trailing.take(&session(1)).is_none());
        assert!(trailing.state().by_session.is_empty());
    }

    #[test]
    fn the_instance_trails_at_most_its_cap_across_sessions() {
        let trailing = Arc::new(SessionSlots::with_caps(2, 5));
        let held: Vec<Slot> = (0..10).filter_map(|n| trailing.take(&session(n))).collect();
        assert_eq!(held.len(), 5, "one each for five sessions, then none");
        assert!(trailing.take(&session(99)).is_none());
        drop(held);
        assert_eq!(trailing.take(&session(99)).map(|_| ()), Some(()));
    }

    #[test]
    fn a_flood_of_one_session_across_threads_never_passes_the_cap() {
        let trailing = Arc::new(SessionSlots::with_caps(4, 100));
        let a = session(1);
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..2_000 {
                        if let Some(slot) = trailing.take(&a) {
                            peak.fetch_max(trailing.len(), std::sync::atomic::Ordering::SeqCst);
                            drop(slot);
                        }
                    }
                });
            }
        });
        assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 4);
        assert!(trailing.is_empty());
    }

    #[tokio::test]
    async fn settled_waits_for_the_last_slot() {
        let trailing = Arc::new(SessionSlots::default());
        trailing.settled().await;
        let (one, two) = (
            trailing.take(&session(1)).expect("slot"),
            trailing.take(&session(2)).expect("slot"),
        );
        let waiter = tokio::spawn({
            let trailing = trailing.clone();
            async move { trailing.settled().await }
        });
        drop(one);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one outcome still trails");
        drop(two);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("settled once the last slot was freed")
            .expect("the waiter");
    }

    #[tokio::test]
    async fn a_session_settles_while_others_still_trail() {
        let trailing = Arc::new(SessionSlots::default());
        let (a, b) = (session(1), session(2));
        let of_a = trailing.take(&a).expect("slot");
        let _of_b = trailing.take(&b).expect("slot");
        let waiter = tokio::spawn({
            let (trailing, a) = (trailing.clone(), a.clone());
            async move { trailing.session_settled(&a).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a's outcome still trails");
        drop(of_a);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("a settled though b still trails")
            .expect("the waiter");
        assert_eq!(trailing.len(), 1);
    }
}
