//! Which sessions may have a call waiting for a person, kept in memory so that a read in
//! a session that never had a hold is decided without a database read.
//!
//! A read must not run while an identical call of its session waits for a person, and a
//! call to a tool becomes a hold while another call to that tool is held; both questions
//! can only be "yes" in a session that has had a hold. Only the deciding transaction
//! creates holds (`decide.rs`), and it marks the session before its commit; at start,
//! every session with a held or approved execution is marked
//! ([`HoldMarks::load`]). A read in an unmarked session therefore has nothing to find,
//! and a read in a marked one asks the database as before: on a snapshot
//! (`read_call`), and in the deciding transaction for a read whose rule reserves a
//! limit (`decide.rs` skips its look-up of the session's earlier calls; it runs after
//! the fence, which orders it after any deciding transaction of the session).
//!
//! With several instances on one database, a session's holds may have been made on
//! another instance (the one that ran the session before it died): every session is
//! marked from the database again when its socket opens here ([`HoldMarks::load_session`],
//! through `session_labels`), before it serves a call. Holds are only ever made by the
//! instance running the session (its socket is the only way to make one), so from then
//! on this instance's marks for it are complete.
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

impl HoldMarks {
    /// Marks `session_id` if it has a held or approved execution in `db` (a session
    /// whose socket opens on this instance, perhaps after it ran on another).
    pub async fn load_session(&self, db: &Db, session_id: &str) -> Result<(), StoreError> {
        let session = session_id.to_owned();
        let pending = db
            .read(move |c| exec_store::session_has_pending(c, &session))
            .await?;
        if pending {
            self.mark(session_id);
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

    #[tokio::test]
    async fn a_session_opening_here_is_marked_from_holds_made_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        // Marks loaded at this instance's start; then another instance's session holds a
        // call (the row is all this instance sees of it).
        let marks = HoldMarks::default();
        marks.load(&db).await.unwrap();
        db.write(|c| {
            c.execute(
                "INSERT INTO executions (id, session_id, thread_id, agent, tool, args, account, \
                 binding_hash, verdict, because, policy_hash, status, created_at_ms) \
                 VALUES ('ex_1', 's_elsewhere', 'th_1', 'support', 'stripe.refund', '{}', \
                 'default', 'h', 'hold', 'rule', 'p', 'held', 1)",
                (),
            )
        })
        .await
        .unwrap();
        assert!(!marks.may_have("s_elsewhere"));
        // The session is taken over here: its socket opens, and it is marked first.
        marks.load_session(&db, "s_elsewhere").await.unwrap();
        assert!(marks.may_have("s_elsewhere"));
        marks.load_session(&db, "s_none").await.unwrap();
        assert!(!marks.may_have("s_none"));
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
