//! The `events` table (migration `0002_events`): every accepted delivery, once per
//! Plain event id. Its only owner: intake stores events here, the supervisor reads the
//! unapplied ones and marks them applied (giving them a feed position), and the sandbox
//! API pages through a thread's feed, all through these functions, with the event class
//! typed as [`EventClass`].
//!
//! These functions take a [`Connection`] so that they run inside [`crate::store::Db::write`]
//! (one group-committed transaction) or [`crate::store::Db::read`].

use crate::store::{Conn, OptionalExtension, params};

use super::envelope::{Envelope, EventClass};

use crate::ids::ThreadId;
use crate::store::leases::{Lease, fence_clause};

/// The outcome of [`insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// A new event, stored under `seq`.
    Inserted {
        /// The event's row number: increasing in the order events were stored.
        seq: i64,
    },
    /// An event with this id is already stored (a retry); nothing changed.
    Duplicate,
}

/// Stores a delivery unless an event with the same id is already stored.
///
/// `body` is the delivery's raw body (kept for the session to read); `received_at_ms`
/// is when threadgate received it. The first delivery of an event wins: a retry's body
/// (with its new attempt metadata) is not stored.
///
/// One statement, so the intake runs it through [`crate::store::Db::write_single`]: on
/// Postgres one round trip, a transaction of its own; the unique `event_id` decides a
/// race under any isolation.
pub fn insert(
    conn: &Conn<'_>,
    envelope: &Envelope,
    body: &str,
    received_at_ms: i64,
) -> crate::store::Result<InsertOutcome> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO events (event_id, event_type, class, thread_id, thread_status, \
             customer_id, customer_email, actor, occurred_at_ms, received_at_ms, body) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT (event_id) DO NOTHING \
         RETURNING seq",
    )?;
    let customer = envelope.customer.as_ref();
    let seq: Option<i64> = statement
        .query_row(
            params![
                envelope.id,
                envelope.event_type,
                envelope.class().as_str(),
                envelope.thread_id,
                envelope.thread_status,
                customer.map(|c| c.id.as_str()),
                customer.and_then(|c| c.email.as_deref()),
                envelope.actor.as_str(),
                envelope.occurred_at_ms,
                received_at_ms,
                body,
            ],
            |row| row.get(0),
        )
        .optional()?;
    Ok(match seq {
        Some(seq) => InsertOutcome::Inserted { seq },
        None => InsertOutcome::Duplicate,
    })
}

/// A stored event the supervisor has not applied yet.
#[derive(Debug, Clone)]
pub struct PendingEvent {
    pub seq: i64,
    pub class: EventClass,
    pub occurred_at_ms: i64,
    pub customer_id: Option<String>,
    pub customer_email: Option<String>,
}

/// Threads with events not yet applied, oldest first. A stored thread id that is no
/// [`ThreadId`] (kept by a version of threadgate that did not check it at intake) is
/// logged and left out: its events cannot start a session, and no other thread's wait
/// for it.
///
/// Only threads `owner` may apply at `now_ms`: those whose session lease it holds or no
/// one holds (another instance's threads are applied by that instance).
pub fn threads_with_pending_events(
    conn: &Conn<'_>,
    owner: &str,
    now_ms: i64,
) -> crate::store::Result<Vec<ThreadId>> {
    let mut stmt = conn.prepare(
        "SELECT e.thread_id FROM events e \
         LEFT JOIN session_leases l ON l.thread_id = e.thread_id \
         WHERE e.applied_at_ms IS NULL AND e.thread_id IS NOT NULL AND e.class != 'ignored' \
         AND (l.thread_id IS NULL OR l.owner = ?1 OR l.expires_at_ms <= ?2) \
         GROUP BY e.thread_id ORDER BY min(e.seq)",
    )?;
    let rows = stmt.query_map(params![owner, now_ms], |r| r.get::<_, String>(0))?;
    let mut threads = Vec::new();
    for text in rows {
        match ThreadId::parse(text?) {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                tracing::warn!(error = %e, "stored events of an invalid thread id are not applied")
            }
        }
    }
    Ok(threads)
}

/// A thread's unapplied events in the order they happened.
pub fn pending_events(
    conn: &Conn<'_>,
    thread_id: &ThreadId,
) -> crate::store::Result<Vec<PendingEvent>> {
    let mut stmt = conn.prepare(
        "SELECT seq, class, occurred_at_ms, customer_id, customer_email FROM events \
         WHERE thread_id = ?1 AND applied_at_ms IS NULL AND class != 'ignored' \
         ORDER BY occurred_at_ms, seq",
    )?;
    let rows = stmt.query_map([thread_id], |r| {
        Ok(PendingEvent {
            seq: r.get(0)?,
            class: stored_class(&r.get::<_, String>(1)?)?,
            occurred_at_ms: r.get(2)?,
            customer_id: r.get(3)?,
            customer_email: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Marks an event applied under its thread's lease; `feed` gives it the next position
/// in its thread's feed (events a session's agent reads), or none when it is not for the
/// agent. A stale lease's statement changes nothing and is [`Lease::lost`]: each event
/// is applied by the one instance holding its thread's lease.
pub fn mark_applied(
    conn: &Conn<'_>,
    lease: &Lease,
    seq: i64,
    feed: bool,
    now_ms: i64,
) -> crate::store::Result<()> {
    let fence = fence_clause(3, 4, 5);
    let changed = if feed {
        conn.execute(
            &format!(
                "UPDATE events SET applied_at_ms = ?2, thread_pos = \
                 (SELECT coalesce(max(thread_pos), 0) + 1 FROM events WHERE thread_id = ?3) \
                 WHERE seq = ?1 AND thread_id = ?3 AND applied_at_ms IS NULL AND {fence}"
            ),
            params![seq, now_ms, lease.thread_id, lease.owner, lease.token],
        )?
    } else {
        conn.execute(
            &format!(
                "UPDATE events SET applied_at_ms = ?2 \
                 WHERE seq = ?1 AND thread_id = ?3 AND applied_at_ms IS NULL AND {fence}"
            ),
            params![seq, now_ms, lease.thread_id, lease.owner, lease.token],
        )?
    };
    if changed == 0 {
        // Refused by the fence (the error), or already applied (nothing to do).
        crate::store::leases::fence(conn, lease)?;
    }
    Ok(())
}

/// One event of a feed page, its body kept as the stored JSON text.
#[derive(Debug, Clone)]
pub struct RawFeedEvent {
    pub position: i64,
    pub event_id: String,
    pub event_type: String,
    pub occurred_at_ms: i64,
    /// The stored event, as JSON text (`null` when the stored text is not JSON).
    pub event_json: String,
}

/// The thread's feed after `after`: at most `limit` events whose bodies add up to at
/// most `max_bytes`, and always the first one, whatever its size (the webhook body
/// limit bounds each event). Rows are read one at a time and reading stops at the
/// budget, so a page never holds more than `max_bytes` plus one event.
pub fn feed_page(
    conn: &Conn<'_>,
    thread_id: &str,
    after: i64,
    limit: i64,
    max_bytes: usize,
) -> crate::store::Result<Vec<RawFeedEvent>> {
    let mut stmt = conn.prepare(
        "SELECT thread_pos, event_id, event_type, occurred_at_ms, \
                octet_length(body), body FROM events \
         WHERE thread_id = ?1 AND thread_pos > ?2 ORDER BY thread_pos LIMIT ?3",
    )?;
    let mut rows = stmt.query(params![thread_id, after, limit])?;
    let mut page = Vec::new();
    let mut used = 0usize;
    while let Some(r) = rows.next()? {
        let size = usize::try_from(r.get::<_, i64>(4)?).unwrap_or(usize::MAX);
        if !page.is_empty() && used.saturating_add(size) > max_bytes {
            break;
        }
        used = used.saturating_add(size);
        let body: String = r.get(5)?;
        let valid = serde_json::from_str::<serde::de::IgnoredAny>(&body).is_ok();
        page.push(RawFeedEvent {
            position: r.get(0)?,
            event_id: r.get(1)?,
            event_type: r.get(2)?,
            occurred_at_ms: r.get(3)?,
            event_json: if valid { body } else { "null".to_owned() },
        });
    }
    Ok(page)
}

/// The body of the thread's latest stored event, if any.
pub fn latest_body(conn: &Conn<'_>, thread_id: &str) -> crate::store::Result<Option<String>> {
    conn.query_row(
        "SELECT body FROM events WHERE thread_id = ?1 ORDER BY seq DESC LIMIT 1",
        [thread_id],
        |r| r.get(0),
    )
    .optional()
}

/// A stored class name as an [`EventClass`]; an unknown name is an error, never a
/// guess.
fn stored_class(name: &str) -> crate::store::Result<EventClass> {
    name.parse::<EventClass>()
        .map_err(|_| crate::store::SqlError::Decode {
            idx: 1,
            message: format!("unknown event class {name:?} in the events table"),
        })
}
