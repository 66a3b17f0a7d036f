//! The `events` table (migration `0002_events`): every accepted delivery, once per
//! Plain event id.
//!
//! These functions take a [`Connection`] so that they run inside [`crate::store::Db::write`]
//! (one group-committed transaction) or [`crate::store::Db::read`].

use rusqlite::{Connection, OptionalExtension, params};

use super::envelope::Envelope;

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
pub fn insert(
    conn: &Connection,
    envelope: &Envelope,
    body: &str,
    received_at_ms: i64,
) -> rusqlite::Result<InsertOutcome> {
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
