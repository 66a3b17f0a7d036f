//! The pods this instance adopted for its sessions ([`Adoptions`], by pod uid), and the
//! relays waiting for their pod's adoption: one waiter per pod, woken when the adoption
//! is recorded, a later wait for the same pod taking the earlier one's place, at most
//! [`MAX_ADOPTION_WAITERS`] at once. Read by `review` (`TokenReviewer`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ids::SessionId;

/// Pods whose relays may wait for their adoption at once (one wait each): as many as
/// positive token reviews are cached.
pub const MAX_ADOPTION_WAITERS: usize = 4096;

/// A pod adopted for a session: its name, and the session it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    pub pod_name: String,
    pub session: SessionId,
}

/// The pods this instance adopted for its sessions, by pod uid: recorded when a claim
/// is bound (and again from the pods' labels after a restart), forgotten when the
/// session's sandbox is stopped.
#[derive(Debug, Clone, Default)]
pub struct Adoptions {
    inner: Arc<Mutex<HashMap<String, Adopted>>>,
    /// The relays waiting for their pod's adoption, by pod uid: one each.
    waiters: Arc<Mutex<Waiters>>,
}

/// Waiting relays: the pod uid's one waiter (its number and how to wake it).
#[derive(Debug, Default)]
struct Waiters {
    next: u64,
    by_pod: HashMap<String, (u64, tokio::sync::oneshot::Sender<Woken>)>,
}

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    Adopted,
    Superseded,
}

/// One relay's wait for its pod's adoption; leaves its place when dropped.
#[derive(Debug)]
pub struct AdoptionWaiter {
    uid: String,
    id: u64,
    woken: tokio::sync::oneshot::Receiver<Woken>,
    waiters: Arc<Mutex<Waiters>>,
}

impl AdoptionWaiter {
    /// Waits at most `hold` to be woken: `Adopted` when the pod's adoption was recorded
    /// meanwhile (the caller looks it up), `Superseded` when a later wait for the same
    /// pod took this one's place (or its place is gone), `None` when `hold` passed.
    pub(super) async fn woken(&mut self, hold: std::time::Duration) -> Option<Woken> {
        match tokio::time::timeout(hold, &mut self.woken).await {
            Ok(Ok(woken)) => Some(woken),
            Ok(Err(_)) => Some(Woken::Superseded),
            Err(_) => None,
        }
    }
}

impl Drop for AdoptionWaiter {
    fn drop(&mut self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if waiters
            .by_pod
            .get(&self.uid)
            .is_some_and(|(id, _)| *id == self.id)
        {
            waiters.by_pod.remove(&self.uid);
        }
    }
}

impl Adoptions {
    /// Records that the pod `uid` serves `adopted.session`, replacing any earlier pod of
    /// the same session.
    pub fn record(&self, uid: String, adopted: Adopted) {
        {
            let mut pods = self.lock();
            pods.retain(|_, a| a.session != adopted.session);
            pods.insert(uid.clone(), adopted);
        }
        self.wake(&uid, Woken::Adopted);
    }

    /// A place to wait for the pod `uid`'s adoption, taking the place of an earlier
    /// wait for the same pod (woken as superseded); `None` when [`MAX_ADOPTION_WAITERS`]
    /// other pods' waits are held. Registered before the caller looks the adoption up,
    /// so an adoption recorded in between still wakes it.
    pub fn waiter(&self, uid: &str) -> Option<AdoptionWaiter> {
        let mut waiters = self.waiters_lock();
        if waiters.by_pod.len() >= MAX_ADOPTION_WAITERS && !waiters.by_pod.contains_key(uid) {
            return None;
        }
        waiters.next += 1;
        let id = waiters.next;
        let (wake, woken) = tokio::sync::oneshot::channel();
        if let Some((_, earlier)) = waiters.by_pod.insert(uid.to_owned(), (id, wake)) {
            let _ = earlier.send(Woken::Superseded);
        }
        Some(AdoptionWaiter {
            uid: uid.to_owned(),
            id,
            woken,
            waiters: self.waiters.clone(),
        })
    }

    /// Relays waiting now (tests, and the cap's check).
    pub fn waiting(&self) -> usize {
        self.waiters_lock().by_pod.len()
    }

    fn wake(&self, uid: &str, why: Woken) {
        if let Some((_, waiter)) = self.waiters_lock().by_pod.remove(uid) {
            let _ = waiter.send(why);
        }
    }

    fn waiters_lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the pod `uid` again after a restart, beside any other pod of the same
    /// session (a pod adopted before a crash its session's row never named is one:
    /// reconciliation removes it, and forgets only it, [`Adoptions::forget_pod`]).
    pub(super) fn restore(&self, uid: String, adopted: Adopted) {
        self.lock().insert(uid.clone(), adopted);
        self.wake(&uid, Woken::Adopted);
    }

    /// Forgets the pod `uid`: its token reaches nothing from now on.
    pub fn forget_pod(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Forgets the pod of `session`: its token reaches nothing from now on.
    pub fn forget_session(&self, session: &SessionId) {
        self.lock().retain(|_, a| &a.session != session);
    }

    /// The adoption of the pod `uid`.
    pub fn get(&self, uid: &str) -> Option<Adopted> {
        self.lock().get(uid).cloned()
    }

    /// How many pods are adopted.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Adopted>> {
        // Every statement leaves the map whole: a panic elsewhere half-writes nothing.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
