//! Event application: in one transaction, a thread's unapplied events become its
//! session's row and feed, and the actor learns what to do next. No IO beyond that
//! transaction, no actor state.

use crate::ids::{SessionId, ThreadId};
use crate::session::store::{self, SessionRow, SessionState};
use crate::store::leases::{self, Lease};
use crate::webhook::EventClass;
use crate::webhook::store as event_store;

/// What applying a thread's events asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Want {
    Nothing,
    /// The running session has new events to read.
    Fed,
    /// A customer wrote: the session must be running.
    Live,
    /// The thread is done.
    End,
}

/// In one transaction, under the thread's lease: creates the session on the first
/// customer event, marks every pending event applied (in timestamp order, giving feed
/// positions to those the agent reads), and says what the supervisor must do. The
/// transaction starts with the lease's fence and every write in it is fenced too, so a
/// stale owner applies nothing ([`Lease::lost`]) and each event is applied by one
/// instance.
pub(super) fn apply_events(
    conn: &crate::store::Conn<'_>,
    lease: &Lease,
    default_agent: &str,
    branch: &str,
    now: i64,
) -> crate::store::Result<Want> {
    leases::fence(conn, lease)?;
    let thread = &lease.thread_id;
    let pending = event_store::pending_events(conn, thread)?;
    let mut row = store::get(conn, thread)?;
    let mut want = Want::Nothing;
    for ev in &pending {
        match ev.class {
            EventClass::Customer => {
                // An event older than the thread's DONE does not reopen it.
                let stale = row.as_ref().is_some_and(|r| {
                    r.state == SessionState::Ended && ev.occurred_at_ms < r.last_event_ms
                });
                if row.is_none() {
                    let fresh = new_session(thread, default_agent, branch, now);
                    store::insert(conn, lease, &fresh)?;
                    row = Some(fresh);
                }
                event_store::mark_applied(conn, lease, ev.seq, true, now)?;
                if !stale {
                    // A customer writing after DONE reopens the thread.
                    store::cancel_stop(conn, lease)?;
                    want = Want::Live;
                }
            }
            EventClass::Done if row.is_some() => {
                event_store::mark_applied(conn, lease, ev.seq, true, now)?;
                // Durable in the same transaction: once the event is marked applied,
                // only this flag remembers that the session must end, should threadgate
                // stop before the session has (the tick ends flagged sessions).
                store::request_stop(conn, thread)?;
                want = Want::End;
            }
            EventClass::Info if row.is_some() => {
                event_store::mark_applied(conn, lease, ev.seq, true, now)?;
                if want == Want::Nothing {
                    want = Want::Fed;
                }
            }
            _ => event_store::mark_applied(conn, lease, ev.seq, false, now)?,
        }
        if row.is_some() {
            store::note_event(
                conn,
                lease,
                ev.occurred_at_ms,
                ev.customer_id.as_deref(),
                ev.customer_email.as_deref(),
            )?;
            if let Some(r) = row.as_mut() {
                r.last_event_ms = r.last_event_ms.max(ev.occurred_at_ms);
            }
        }
    }
    Ok(want)
}

fn new_session(thread: &ThreadId, agent: &str, branch: &str, now: i64) -> SessionRow {
    SessionRow {
        thread_id: thread.clone(),
        session_id: SessionId::random(),
        agent: agent.to_owned(),
        state: SessionState::Queued,
        container_id: None,
        branch: branch.to_owned(),
        worktree: None,
        customer_id: None,
        customer_email: None,
        created_at_ms: now,
        updated_at_ms: now,
        last_event_ms: 0,
        attempts: 0,
        last_error: None,
        stop_requested: false,
    }
}
