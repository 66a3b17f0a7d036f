//! The model proxy's tables: per-session usage (tokens, turns, when the budget ran out)
//! and the runner's transcript.

use crate::store::{Conn, OptionalExtension as _, params};

/// What a session has spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    pub tokens: u64,
    pub turns: u64,
    /// Whether the budget already ran out (and the note was queued).
    pub exhausted: bool,
}

/// The session's usage so far.
pub fn spent(conn: &Conn<'_>, session_id: &str) -> crate::store::Result<Spent> {
    conn.query_row(
        "SELECT tokens_used, turns_used, exhausted_at_ms IS NOT NULL FROM model_usage \
         WHERE session_id = ?1",
        [session_id],
        |r| {
            Ok(Spent {
                tokens: r.get::<_, i64>(0)?.max(0) as u64,
                turns: r.get::<_, i64>(1)?.max(0) as u64,
                exhausted: r.get(2)?,
            })
        },
    )
    .optional()
    .map(Option::unwrap_or_default)
}

/// What the model cost on a thread, over all its sessions (a pull request's "cost").
pub fn thread_cost(
    conn: &Conn<'_>,
    thread_id: &str,
) -> crate::store::Result<crate::session::publish::SessionCost> {
    conn.query_row(
        "SELECT coalesce(sum(turns_used), 0), coalesce(sum(tokens_used), 0) FROM model_usage \
         WHERE thread_id = ?1",
        [thread_id],
        |r| {
            Ok(crate::session::publish::SessionCost {
                turns: r.get::<_, i64>(0)?.max(0) as u64,
                tokens: r.get::<_, i64>(1)?.max(0) as u64,
            })
        },
    )
}

/// Counts one turn and reserves `reserved_tokens` of the budget for it, before the call
/// goes upstream: a call that fails, times out or is cut off still counts, as much as
/// it could have cost ([`settle_tokens`] brings a call that answered to what it used).
pub fn add_turn(
    conn: &Conn<'_>,
    session_id: &str,
    thread_id: &str,
    reserved_tokens: u64,
) -> crate::store::Result<()> {
    conn.execute(
        "INSERT INTO model_usage (session_id, thread_id, turns_used, tokens_used) \
         VALUES (?1, ?2, 1, ?3) ON CONFLICT (session_id) DO UPDATE SET \
         turns_used = model_usage.turns_used + 1, \
         tokens_used = model_usage.tokens_used + ?3",
        params![
            session_id,
            thread_id,
            i64::try_from(reserved_tokens).unwrap_or(i64::MAX)
        ],
    )?;
    Ok(())
}

/// Settles a turn's reservation: adds `delta` (the tokens the upstream reported less
/// those reserved, so negative when it used fewer) to the session's count.
pub fn settle_tokens(conn: &Conn<'_>, session_id: &str, delta: i64) -> crate::store::Result<()> {
    conn.execute(
        "UPDATE model_usage SET tokens_used = tokens_used + ?2 WHERE session_id = ?1",
        params![session_id, delta],
    )?;
    Ok(())
}

/// Marks the budget spent; true only the first time (the caller then queues the note).
pub fn mark_exhausted(
    conn: &Conn<'_>,
    session_id: &str,
    thread_id: &str,
    now_ms: i64,
) -> crate::store::Result<bool> {
    conn.execute(
        "INSERT INTO model_usage (session_id, thread_id) VALUES (?1, ?2) \
         ON CONFLICT (session_id) DO NOTHING",
        params![session_id, thread_id],
    )?;
    let changed = conn.execute(
        "UPDATE model_usage SET exhausted_at_ms = ?2 WHERE session_id = ?1 \
         AND exhausted_at_ms IS NULL",
        params![session_id, now_ms],
    )?;
    Ok(changed == 1)
}

/// A stored transcript: the messages as JSON text and the feed position consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTranscript {
    pub messages: String,
    pub events_consumed: i64,
}

/// The session's transcript, if one was stored.
pub fn transcript(
    conn: &Conn<'_>,
    session_id: &str,
) -> crate::store::Result<Option<StoredTranscript>> {
    conn.query_row(
        "SELECT messages, events_consumed FROM transcripts WHERE session_id = ?1",
        [session_id],
        |r| {
            Ok(StoredTranscript {
                messages: r.get(0)?,
                events_consumed: r.get(1)?,
            })
        },
    )
    .optional()
}

/// Replaces the session's transcript.
pub fn put_transcript(
    conn: &Conn<'_>,
    session_id: &str,
    t: &StoredTranscript,
    now_ms: i64,
) -> crate::store::Result<()> {
    conn.execute(
        "INSERT INTO transcripts (session_id, messages, events_consumed, bytes, updated_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (session_id) DO UPDATE SET \
         messages = excluded.messages, events_consumed = excluded.events_consumed, \
         bytes = excluded.bytes, updated_at_ms = excluded.updated_at_ms",
        params![
            session_id,
            t.messages,
            t.events_consumed,
            t.messages.len() as i64,
            now_ms
        ],
    )?;
    Ok(())
}

/// Deletes the transcripts last written at or before `written_before_ms`; how many.
pub fn forget_transcripts(conn: &Conn<'_>, written_before_ms: i64) -> crate::store::Result<usize> {
    conn.execute(
        "DELETE FROM transcripts WHERE updated_at_ms <= ?1",
        [written_before_ms],
    )
}
