//! The calls this process is sending now: from just after the commit that made each
//! `running` (its decision, an approval's claim, recovery's take-over) until its
//! outcome is written, a read's trailing outcome included. A `running` row of this
//! instance that is not here, two sweeps in a row, was cut off (a database server that
//! lost an unflushed outcome, an outcome that could not be written, a task cut at the
//! shutdown deadline) and is recovered by the approvals' sweep without a restart.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ids::ExecutionId;

/// The ids of the calls in flight here.
#[derive(Debug, Default)]
pub struct Sending {
    ids: Arc<Mutex<HashSet<ExecutionId>>>,
}

/// One call in flight: its id leaves [`Sending`] when this is dropped (its outcome
/// written, or the task that held it ended in any way).
#[derive(Debug)]
pub struct InFlight {
    ids: Arc<Mutex<HashSet<ExecutionId>>>,
    id: ExecutionId,
}

impl Sending {
    /// Marks `id` in flight until the returned guard is dropped.
    pub fn start(&self, id: &ExecutionId) -> InFlight {
        lock(&self.ids).insert(id.clone());
        InFlight {
            ids: self.ids.clone(),
            id: id.clone(),
        }
    }

    /// Whether `id` is in flight here now.
    pub fn contains(&self, id: &ExecutionId) -> bool {
        lock(&self.ids).contains(id)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.ids).remove(&self.id);
    }
}

fn lock(ids: &Mutex<HashSet<ExecutionId>>) -> MutexGuard<'_, HashSet<ExecutionId>> {
    // Plain data: a panic while it was held leaves a usable set.
    ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_in_flight_until_its_guard_goes() {
        let sending = Sending::default();
        let (a, b) = (
            ExecutionId::parse("ex_a").expect("id"),
            ExecutionId::parse("ex_b").expect("id"),
        );
        let first = sending.start(&a);
        let second = sending.start(&b);
        assert!(sending.contains(&a) && sending.contains(&b));
        drop(first);
        assert!(!sending.contains(&a));
        assert!(sending.contains(&b));
        let moved = std::thread::spawn(move || drop(second));
        moved.join().expect("join");
        assert!(!sending.contains(&b));
    }
}
