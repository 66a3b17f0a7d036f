//! Which sessions may have a call waiting for a person, kept in memory so that a read in
//! a session that never had a hold is decided without a database read.
//!
//! A read must not run while an identical call of its session waits for a person, and a
//! call to a tool becomes a hold while another call to that tool is held; both questions
//! can only be "yes" in a session that has had a hold. Only the deciding transaction
//! creates holds (`decide.rs`), and it marks the session before its commit; at start,
//! every session with a held or approved execution is marked
//! ([`HoldMarks::load`]). A read in an unmarked session therefore has nothing to find,
//! and a read in a marked one asks the database as before.
//!
//! INVARIANT: a session with a held or approved execution is marked, or the marks have
//! overflowed and every session counts as marked. Marks are never removed.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::executions::store as exec_store;
use crate::store::{Db, StoreError};

/// Sessions marked before every session counts as marked (a bound on memory).
const MAX_MARKED: usize = 100_000;

/// The sessions that may have a call waiting for a person (see the module docs).
#[derive(Debug, Default)]
pub struct HoldMarks {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashSet<String>,
    /// Past [`MAX_MARKED`]: every session counts as marked.
    overflowed: bool,
}

impl HoldMarks {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `session_id`: it has (or is about to have) a held call.
    pub fn mark(&self, session_id: &str) {
        let mut state = self.state();
        if state.overflowed || state.sessions.contains(session_id) {
            return;
        }
        if state.sessions.len() >= MAX_MARKED {
            state.overflowed = true;
            state.sessions.clear();
            return;
        }
        state.sessions.insert(session_id.to_owned());
    }

    /// Whether `session_id` may have a held or approved call.
    pub fn may_have(&self, session_id: &str) -> bool {
        let state = self.state();
        state.overflowed || state.sessions.contains(session_id)
    }

    /// Marks every session that has a held or approved execution in `db` (at start,
    /// before any session socket serves a call).
    pub async fn load(&self, db: &Db) -> Result<(), StoreError> {
        let sessions = db.read(exec_store::sessions_with_pending).await?;
        for session in sessions {
            self.mark(&session);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_session_may_have_a_hold_and_another_does_not() {
        let marks = HoldMarks::default();
        assert!(!marks.may_have("s1"));
        marks.mark("s1");
        assert!(marks.may_have("s1"));
        assert!(!marks.may_have("s2"));
    }

    #[test]
    fn past_the_bound_every_session_counts_as_marked() {
        let marks = HoldMarks::default();
        for i in 0..=MAX_MARKED {
            marks.mark(&format!("s{i}"));
        }
        assert!(marks.may_have("never-marked"));
        assert!(
            marks.state().sessions.is_empty(),
            "the memory is given back"
        );
    }
}
