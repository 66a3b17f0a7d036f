//! The state labels a thread should carry in Plain (`[plain] labels`), kept in step
//! with its session: agent working while the session runs, waiting for approval while
//! it has a held call, handed to a person once it stopped on its own. Each change marks
//! the thread for a sync (a version past the synced one) in the transaction that makes
//! it; the outbox (`notes::label_outbox`) makes Plain match. What is stored is the
//! wanted state, not the steps to it, so a sync repeated after a crash does no harm.

use crate::store::{Conn, OptionalExtension, params};

use crate::store::cached_execute;

/// What a thread should show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WantedLabels {
    pub waiting_for_approval: bool,
    pub agent_working: bool,
    pub handed_to_person: bool,
}

/// A thread whose labels wait for a sync.
#[derive(Debug, Clone)]
pub struct LabelSync {
    pub thread_id: String,
    pub wanted: WantedLabels,
    /// The version this sync brings Plain to.
    pub version: i64,
    pub attempts: i64,
}

/// Marks `thread` for a sync (a held call was held, decided or expired).
pub fn touch(conn: &Conn<'_>, thread_id: &str, now_ms: i64) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "INSERT INTO thread_label_state (thread_id, next_attempt_ms) VALUES (?1, ?2) \
         ON CONFLICT (thread_id) DO UPDATE SET version = thread_label_state.version + 1, attempts = 0, \
         next_attempt_ms = ?2",
        params![thread_id, now_ms],
    )?;
    Ok(())
}

/// Records whether the thread's session runs. A session that runs again is the
/// agent's again: the thread is no longer shown as handed to a person.
pub fn set_working(
    conn: &Conn<'_>,
    thread_id: &str,
    working: bool,
    now_ms: i64,
) -> crate::store::Result<()> {
    touch(conn, thread_id, now_ms)?;
    // Two statements rather than one parameter used both as the column's value and in
    // a comparison with a literal: Postgres deduces two types for such a parameter.
    let statement = if working {
        "UPDATE thread_label_state SET agent_working = 1, handed_to_person = 0 \
         WHERE thread_id = ?1"
    } else {
        "UPDATE thread_label_state SET agent_working = 0 WHERE thread_id = ?1"
    };
    cached_execute(conn, statement, [thread_id])?;
    Ok(())
}

/// Records that the thread's session stopped on its own: a person takes over.
pub fn set_handed_to_person(
    conn: &Conn<'_>,
    thread_id: &str,
    now_ms: i64,
) -> crate::store::Result<()> {
    touch(conn, thread_id, now_ms)?;
    cached_execute(
        conn,
        "UPDATE thread_label_state SET handed_to_person = 1, agent_working = 0 \
         WHERE thread_id = ?1",
        [thread_id],
    )?;
    Ok(())
}

/// Threads whose labels wait for a sync and are due, `limit` at most.
pub fn due(conn: &Conn<'_>, now_ms: i64, limit: i64) -> crate::store::Result<Vec<LabelSync>> {
    let mut stmt = conn.prepare_cached(
        "SELECT s.thread_id, s.agent_working, s.handed_to_person, s.version, s.attempts, \
           EXISTS (SELECT 1 FROM executions e WHERE e.thread_id = s.thread_id \
                   AND e.status = 'held') \
         FROM thread_label_state s \
         WHERE s.version > s.synced_version AND s.next_attempt_ms <= ?1 \
           AND s.claimed_until_ms <= ?1 \
         ORDER BY s.next_attempt_ms, s.thread_id LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![now_ms, limit], |r| {
        let handed: bool = r.get(2)?;
        Ok(LabelSync {
            thread_id: r.get(0)?,
            wanted: WantedLabels {
                agent_working: r.get::<_, bool>(1)? && !handed,
                handed_to_person: handed,
                waiting_for_approval: r.get(5)?,
            },
            version: r.get(3)?,
            attempts: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Takes the syncs [`due`] names for one drainer until `until_ms`: another instance
/// sharing the database does not sync those threads meanwhile (two syncs of one thread
/// at once could leave Plain with the older version's labels). A thread another
/// drainer claimed first (its transaction committed first) is left out. A drainer that
/// dies mid-sync leaves its claim to expire.
pub fn claim(
    conn: &Conn<'_>,
    now_ms: i64,
    limit: i64,
    until_ms: i64,
) -> crate::store::Result<Vec<LabelSync>> {
    let mut claimed = Vec::new();
    for sync in due(conn, now_ms, limit)? {
        let took = cached_execute(
            conn,
            "UPDATE thread_label_state SET claimed_until_ms = ?2 \
             WHERE thread_id = ?1 AND claimed_until_ms <= ?3",
            params![sync.thread_id, until_ms, now_ms],
        )?;
        if took == 1 {
            claimed.push(sync);
        }
    }
    Ok(claimed)
}

/// Records that Plain carries the labels of `version` (a later change stays due).
pub fn synced(conn: &Conn<'_>, thread_id: &str, version: i64) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE thread_label_state SET synced_version = \
         CASE WHEN synced_version > ?2 THEN synced_version ELSE ?2 END, \
         last_error = NULL, claimed_until_ms = 0 WHERE thread_id = ?1",
        params![thread_id, version],
    )?;
    Ok(())
}

/// Records a failed sync and when to try again.
pub fn sync_failed(
    conn: &Conn<'_>,
    thread_id: &str,
    error: &str,
    next_attempt_ms: i64,
) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE thread_label_state SET last_error = ?2, next_attempt_ms = ?3, \
         attempts = attempts + 1, claimed_until_ms = 0 WHERE thread_id = ?1",
        params![thread_id, error, next_attempt_ms],
    )?;
    Ok(())
}

/// The last sync error of `thread`, if any (for operators and tests).
pub fn last_error(conn: &Conn<'_>, thread_id: &str) -> crate::store::Result<Option<String>> {
    conn.query_row(
        "SELECT last_error FROM thread_label_state WHERE thread_id = ?1",
        [thread_id],
        |r| r.get(0),
    )
    .optional()
    .map(Option::flatten)
}
