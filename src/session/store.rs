//! The sessions table: every query the supervisor and the operators' commands run about
//! sessions. (The events they apply belong to [`crate::webhook::store`]; the pause flag
//! to [`crate::store::meta`].)

use crate::store::{Conn, OptionalExtension, params};
use serde::Serialize;

use crate::ids::{SessionId, ThreadId};
use crate::store::leases::{self, Lease, fence_clause};
use crate::store::meta;

/// Where a session stands. Stored as lowercase text; unknown text read back is an
/// error (`FromStr`), never a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr, strum::EnumString)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum SessionState {
    /// Wants a container and is waiting for a slot (or for the pause to lift).
    Queued,
    /// A container is being started.
    Starting,
    /// Its container is running.
    Running,
    /// Quiet (or only waiting for a person): no container, resumed by its next event or
    /// by a decision on its held call.
    Idle,
    /// The thread is done: container removed, work committed, worktree removed.
    Ended,
}

impl SessionState {
    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One row of the sessions table.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRow {
    pub thread_id: ThreadId,
    pub session_id: SessionId,
    pub agent: String,
    pub state: SessionState,
    pub container_id: Option<String>,
    pub branch: String,
    pub worktree: Option<String>,
    pub customer_id: Option<String>,
    pub customer_email: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub last_event_ms: i64,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub stop_requested: bool,
}

const COLUMNS: &str = "thread_id, session_id, agent, state, container_id, branch, worktree, \
     customer_id, customer_email, created_at_ms, updated_at_ms, last_event_ms, attempts, \
     last_error, stop_requested";

fn row_to_session(row: &crate::store::Row<'_>) -> crate::store::Result<SessionRow> {
    Ok(SessionRow {
        thread_id: row.get(0)?,
        session_id: row.get(1)?,
        agent: row.get(2)?,
        state: crate::store::named(row, 3)?,
        container_id: row.get(4)?,
        branch: row.get(5)?,
        worktree: row.get(6)?,
        customer_id: row.get(7)?,
        customer_email: row.get(8)?,
        created_at_ms: row.get(9)?,
        updated_at_ms: row.get(10)?,
        last_event_ms: row.get(11)?,
        attempts: row.get(12)?,
        last_error: row.get(13)?,
        stop_requested: row.get::<_, i64>(14)? != 0,
    })
}

/// The session of `thread_id`, if it ever had one.
pub fn get(conn: &Conn<'_>, thread_id: &ThreadId) -> crate::store::Result<Option<SessionRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM sessions WHERE thread_id = ?1"),
        [thread_id],
        row_to_session,
    )
    .optional()
}

/// The thread of the session `session_id` while it has not ended.
pub fn live_thread_of(
    conn: &Conn<'_>,
    session_id: &crate::ids::SessionId,
) -> crate::store::Result<Option<ThreadId>> {
    conn.query_row(
        "SELECT thread_id FROM sessions WHERE session_id = ?1 AND state <> 'ended'",
        [session_id],
        |r| r.get(0),
    )
    .optional()
}

/// Every session, newest first.
pub fn list(conn: &Conn<'_>) -> crate::store::Result<Vec<SessionRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM sessions ORDER BY created_at_ms DESC, thread_id"
    ))?;
    let rows = stmt.query_map((), row_to_session)?;
    rows.collect()
}

/// Sessions in one of `states`, oldest update first (the order queued sessions start in).
pub fn in_states(
    conn: &Conn<'_>,
    states: &[SessionState],
) -> crate::store::Result<Vec<SessionRow>> {
    let names: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM sessions WHERE state IN ({}) ORDER BY updated_at_ms, thread_id",
        names.join(",")
    ))?;
    let rows = stmt.query_map((), row_to_session)?;
    rows.collect()
}

/// Creates the session of a thread in state `queued`, under the thread's lease: a
/// stale owner's insert changes nothing and is [`Lease::lost`].
pub fn insert(conn: &Conn<'_>, lease: &Lease, row: &SessionRow) -> crate::store::Result<()> {
    let changed = conn.execute(
        &format!(
            "INSERT INTO sessions ({COLUMNS}) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
             ?11, ?12, ?13, ?14, ?15 WHERE {}",
            fence_clause(1, 16, 17)
        ),
        params![
            row.thread_id,
            row.session_id,
            row.agent,
            row.state.as_str(),
            row.container_id,
            row.branch,
            row.worktree,
            row.customer_id,
            row.customer_email,
            row.created_at_ms,
            row.updated_at_ms,
            row.last_event_ms,
            row.attempts,
            row.last_error,
            row.stop_requested as i64,
            lease.owner,
            lease.token,
        ],
    )?;
    refused_unless_held(conn, lease, changed)
}

/// A fenced statement changed `changed` rows: none because the lease is no longer
/// held is [`Lease::lost`]; none because there was no row to change is fine.
fn refused_unless_held(conn: &Conn<'_>, lease: &Lease, changed: usize) -> crate::store::Result<()> {
    if changed == 0 {
        leases::fence(conn, lease)?;
    }
    Ok(())
}

/// Moves a session to `state`, recording its container (or none), under the thread's
/// lease: every statement's `WHERE` carries the fence, so a stale owner's transition
/// changes nothing and is [`Lease::lost`].
pub fn set_state(
    conn: &Conn<'_>,
    lease: &Lease,
    state: SessionState,
    container_id: Option<&str>,
    now_ms: i64,
) -> crate::store::Result<()> {
    let fence = fence_clause(1, 5, 6);
    let changed = conn.execute(
        &format!(
            "UPDATE sessions SET state = ?2, container_id = ?3, updated_at_ms = ?4 \
             WHERE thread_id = ?1 AND {fence}"
        ),
        params![
            lease.thread_id,
            state.as_str(),
            container_id,
            now_ms,
            lease.owner,
            lease.token
        ],
    )?;
    refused_unless_held(conn, lease, changed)?;
    let fence = fence_clause(1, 2, 3);
    let fenced = params![lease.thread_id, lease.owner, lease.token];
    if state == SessionState::Ended {
        conn.execute(
            &format!(
                "UPDATE sessions SET stop_requested = 0, worktree = NULL \
                 WHERE thread_id = ?1 AND {fence}"
            ),
            fenced,
        )?;
    }
    if state == SessionState::Running {
        conn.execute(
            &format!(
                "UPDATE sessions SET attempts = 0, last_error = NULL \
                 WHERE thread_id = ?1 AND {fence}"
            ),
            fenced,
        )?;
    }
    Ok(())
}

/// Records a failed start: the session goes back to `queued` and is retried later.
/// Fenced by the thread's lease.
pub fn record_failure(
    conn: &Conn<'_>,
    lease: &Lease,
    error: &str,
    now_ms: i64,
) -> crate::store::Result<()> {
    let changed = conn.execute(
        &format!(
            "UPDATE sessions SET state = 'queued', container_id = NULL, attempts = attempts + 1, \
             last_error = ?4, updated_at_ms = ?5 WHERE thread_id = ?1 AND {}",
            fence_clause(1, 2, 3)
        ),
        params![lease.thread_id, lease.owner, lease.token, error, now_ms],
    )?;
    refused_unless_held(conn, lease, changed)
}

/// Records where the session's worktree is. Fenced by the thread's lease.
pub fn set_worktree(conn: &Conn<'_>, lease: &Lease, worktree: &str) -> crate::store::Result<()> {
    let changed = conn.execute(
        &format!(
            "UPDATE sessions SET worktree = ?4 WHERE thread_id = ?1 AND {}",
            fence_clause(1, 2, 3)
        ),
        params![lease.thread_id, lease.owner, lease.token, worktree],
    )?;
    refused_unless_held(conn, lease, changed)
}

/// Sessions that should be live (starting or running) but whose lease no one holds at
/// `now_ms` (never had one, released, or expired with its owner gone): the sessions
/// another instance must take over. Oldest update first.
pub fn unowned_live(conn: &Conn<'_>, now_ms: i64) -> crate::store::Result<Vec<SessionRow>> {
    let columns: Vec<String> = COLUMNS.split(", ").map(|c| format!("s.{c}")).collect();
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {} FROM sessions s LEFT JOIN session_leases l ON l.thread_id = s.thread_id \
         WHERE s.state IN ('starting', 'running') \
         AND (l.thread_id IS NULL OR l.expires_at_ms <= ?1) \
         ORDER BY s.updated_at_ms, s.thread_id",
        columns.join(", ")
    ))?;
    let rows = stmt.query_map([now_ms], row_to_session)?;
    rows.collect()
}

/// Asks the running server to stop a thread's session (`threadgate sessions stop`).
/// Returns false when the thread has no session.
pub fn request_stop(conn: &Conn<'_>, thread_id: &ThreadId) -> crate::store::Result<bool> {
    let changed = conn.execute(
        "UPDATE sessions SET stop_requested = 1 WHERE thread_id = ?1 AND state != 'ended'",
        [thread_id],
    )?;
    Ok(changed > 0)
}

/// Withdraws a stop request (a customer wrote after the thread's DONE). Fenced by the
/// thread's lease.
pub fn cancel_stop(conn: &Conn<'_>, lease: &Lease) -> crate::store::Result<()> {
    let changed = conn.execute(
        &format!(
            "UPDATE sessions SET stop_requested = 0 WHERE thread_id = ?1 AND {}",
            fence_clause(1, 2, 3)
        ),
        params![lease.thread_id, lease.owner, lease.token],
    )?;
    refused_unless_held(conn, lease, changed)
}

/// Threads whose session must stop: an operator asked, or the thread is DONE.
pub fn stop_requests(conn: &Conn<'_>) -> crate::store::Result<Vec<ThreadId>> {
    let mut stmt = conn.prepare("SELECT thread_id FROM sessions WHERE stop_requested = 1")?;
    let rows = stmt.query_map((), |r| r.get(0))?;
    rows.collect()
}

/// Threads whose session must stop and that `owner` may act on at `now_ms`: it holds
/// their lease, or no one does (another instance's are ended by that instance).
pub fn stop_requests_for(
    conn: &Conn<'_>,
    owner: &str,
    now_ms: i64,
) -> crate::store::Result<Vec<ThreadId>> {
    let mut stmt = conn.prepare(
        "SELECT s.thread_id FROM sessions s \
         LEFT JOIN session_leases l ON l.thread_id = s.thread_id \
         WHERE s.stop_requested = 1 \
         AND (l.thread_id IS NULL OR l.owner = ?1 OR l.expires_at_ms <= ?2)",
    )?;
    let rows = stmt.query_map(params![owner, now_ms], |r| r.get(0))?;
    rows.collect()
}

/// Whether new sessions are paused (webhooks are still stored and acknowledged).
pub fn paused(conn: &Conn<'_>) -> crate::store::Result<bool> {
    Ok(meta::get(conn, meta::PAUSED)?.as_deref() == Some("1"))
}

/// Sets or lifts the global pause.
pub fn set_paused(conn: &Conn<'_>, paused: bool) -> crate::store::Result<()> {
    meta::set(conn, meta::PAUSED, if paused { "1" } else { "0" })
}

/// Records the newest event time applied to a session and who the customer is.
/// Fenced by the thread's lease.
pub fn note_event(
    conn: &Conn<'_>,
    lease: &Lease,
    occurred_at_ms: i64,
    customer_id: Option<&str>,
    customer_email: Option<&str>,
) -> crate::store::Result<()> {
    let changed = conn.execute(
        &format!(
            "UPDATE sessions SET last_event_ms = CASE WHEN last_event_ms > ?4 THEN last_event_ms \
             ELSE ?4 END, customer_id = coalesce(customer_id, ?5), \
             customer_email = coalesce(customer_email, ?6) WHERE thread_id = ?1 AND {}",
            fence_clause(1, 2, 3)
        ),
        params![
            lease.thread_id,
            lease.owner,
            lease.token,
            occurred_at_ms,
            customer_id,
            customer_email
        ],
    )?;
    refused_unless_held(conn, lease, changed)
}

/// How many sessions are in each state (states without one are absent).
pub fn count_by_state(conn: &Conn<'_>) -> crate::store::Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare("SELECT state, count(*) FROM sessions GROUP BY state")?;
    let rows = stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;

    #[tokio::test]
    async fn an_unknown_state_in_the_database_is_an_error_not_a_queued_session() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        let row = SessionRow {
            thread_id: ThreadId::parse("th_1").unwrap(),
            session_id: SessionId::parse("s_1").unwrap(),
            agent: "support".into(),
            state: SessionState::Idle,
            container_id: None,
            branch: "threadgate/th_1".into(),
            worktree: None,
            customer_id: None,
            customer_email: None,
            created_at_ms: 1,
            updated_at_ms: 1,
            last_event_ms: 1,
            attempts: 0,
            last_error: None,
            stop_requested: false,
        };
        db.write(move |c| {
            let lease =
                leases::acquire(c, &row.thread_id, "inst-a", 1, 15_000)?.expect("a free lease");
            insert(c, &lease, &row)
        })
        .await
        .unwrap();
        let read = db
            .read(|c| get(c, &ThreadId::parse("th_1").unwrap()))
            .await
            .unwrap();
        assert_eq!(read.map(|r| r.state), Some(SessionState::Idle));

        // The table's CHECK refuses it; a database written by a newer version (or edited
        // by hand) can still hold it.
        db.write(|c| {
            c.execute_batch(
                "PRAGMA ignore_check_constraints = ON; \
                 UPDATE sessions SET state = 'paused'; \
                 PRAGMA ignore_check_constraints = OFF;",
            )
        })
        .await
        .unwrap();
        let err = db
            .read(|c| get(c, &ThreadId::parse("th_1").unwrap()))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("unknown SessionState \"paused\""),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_stale_owners_transitions_and_applied_events_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).unwrap();
        let thread = ThreadId::parse("th_s").unwrap();
        let t = thread.clone();
        let old = db
            .write(move |c| {
                let lease = leases::acquire(c, &t, "inst-a", 1_000, 15_000)?.expect("free");
                let row = SessionRow {
                    thread_id: t.clone(),
                    session_id: SessionId::parse("s_s").unwrap(),
                    agent: "support".into(),
                    state: SessionState::Queued,
                    container_id: None,
                    branch: "threadgate/th_s".into(),
                    worktree: None,
                    customer_id: None,
                    customer_email: None,
                    created_at_ms: 1_000,
                    updated_at_ms: 1_000,
                    last_event_ms: 0,
                    attempts: 0,
                    last_error: None,
                    stop_requested: false,
                };
                insert(c, &lease, &row)?;
                set_state(c, &lease, SessionState::Running, Some("c-old"), 2_000)?;
                c.execute(
                    "INSERT INTO events (event_id, event_type, class, thread_id, actor, \
                     occurred_at_ms, received_at_ms, body) \
                     VALUES ('pEv_s', 'thread.email_received', 'customer', 'th_s', \
                     'customer', 3000, 3000, '{}')",
                    (),
                )?;
                Ok(lease)
            })
            .await
            .unwrap();
        // inst-a stops renewing; inst-b takes the thread over once the lease expired.
        let t = thread.clone();
        let new = db
            .write(move |c| leases::acquire(c, &t, "inst-b", 20_000, 15_000))
            .await
            .unwrap()
            .expect("expired");
        assert!(new.token > old.token);

        // Every write of the stale owner is refused by the database and changes nothing.
        let stale = old.clone();
        let refused = [
            db.write({
                let l = stale.clone();
                move |c| set_state(c, &l, SessionState::Ended, None, 21_000)
            })
            .await,
            db.write({
                let l = stale.clone();
                move |c| record_failure(c, &l, "boom", 21_000)
            })
            .await,
            db.write({
                let l = stale.clone();
                move |c| set_worktree(c, &l, "/elsewhere")
            })
            .await,
            db.write({
                let l = stale.clone();
                move |c| note_event(c, &l, 99_000, Some("c_x"), None)
            })
            .await,
            db.write({
                let l = stale.clone();
                move |c| cancel_stop(c, &l)
            })
            .await,
            db.write({
                let l = stale.clone();
                move |c| crate::webhook::store::mark_applied(c, &l, 1, true, 21_000)
            })
            .await,
        ];
        for result in refused {
            let err = result.unwrap_err();
            assert!(leases::is_lost(&err), "{err}");
        }
        let t = thread.clone();
        let row = db.read(move |c| get(c, &t)).await.unwrap().unwrap();
        assert_eq!(row.state, SessionState::Running);
        assert_eq!(row.container_id.as_deref(), Some("c-old"));
        assert_eq!((row.updated_at_ms, row.attempts), (2_000, 0));
        assert_eq!(
            (row.worktree, row.customer_id, row.last_event_ms),
            (None, None, 0)
        );
        let pending: i64 = db
            .read(|c| {
                c.query_row(
                    "SELECT count(*) FROM events WHERE applied_at_ms IS NULL",
                    (),
                    |r| r.get(0),
                )
            })
            .await
            .unwrap();
        assert_eq!(pending, 1, "the stale owner applied no event");

        // The new owner's writes land.
        let l = new.clone();
        db.write(move |c| {
            set_state(c, &l, SessionState::Starting, None, 22_000)?;
            crate::webhook::store::mark_applied(c, &l, 1, true, 22_000)
        })
        .await
        .unwrap();
        let t = thread.clone();
        let row = db.read(move |c| get(c, &t)).await.unwrap().unwrap();
        assert_eq!(row.state, SessionState::Starting);
    }
}
