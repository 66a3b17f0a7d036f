//! A held call's trail on its Plain thread: one thread event (Plain's
//! `createThreadEvent`) when it is held, with a "Review in threadgate" link button to
//! its approval page, one when it is decided (approved by whom, narrowed to what,
//! denied with which message, expired, blocked when re-checked) and one when it ran
//! (succeeded, failed, outcome unknown). Support staff read where the call is without
//! leaving the thread.
//!
//! Each event is queued in the transaction that makes the change it tells of, in the
//! thread event outbox (`thread_event_outbox`), and posted by the outbox
//! (`notes::trail_outbox`), never from a request handler. Each carries its own
//! external id, `<execution id>:<step>`; Plain refuses a second event with an external
//! id it has, so a re-sent event (after a crash, or from a second instance) never shows
//! twice, and the queue refuses to hold the same external id twice.
//!
//! Every text of an event is plain text (`componentPlainText`, no Markdown), passed
//! through the redactor: the summary quotes the agent's arguments, and a person's
//! message or a provider's error may hold anything.

use crate::store::{Conn, params};

use super::store::{Execution, Status};
use crate::ids::ThreadId;
use crate::secrets::Redactor;
use crate::store::cached_execute;

/// The label of the link button to a held call's approval page.
pub const REVIEW_BUTTON: &str = "Review in threadgate";
/// Plain takes at most this many characters in one text component.
const MAX_TEXT_CHARS: usize = 10_000;

/// One thread event waiting to reach Plain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrailEvent {
    /// `<execution id>:<step>`; Plain takes each external id once.
    pub external_id: String,
    pub thread_id: ThreadId,
    pub title: String,
    /// Plain text, shown as written.
    pub body: String,
    /// A link button: `(url, label)`.
    pub link: Option<(String, String)>,
    /// Attempts made so far.
    pub attempts: i64,
}

impl TrailEvent {
    fn new(exec: &Execution, step: &str, title: String, body: String) -> TrailEvent {
        TrailEvent {
            external_id: format!("{}:{step}", exec.id),
            thread_id: exec.thread_id.clone(),
            title,
            body: clipped(body),
            link: None,
            attempts: 0,
        }
    }
}

/// The event of a call held for a person, with the button to its approval page.
pub fn held(exec: &Execution, approval_url: &str) -> TrailEvent {
    let summary = exec.summary.as_deref().unwrap_or(&exec.tool);
    let mut event = TrailEvent::new(
        exec,
        "held",
        format!("Waiting for approval: {}", exec.tool),
        format!("{summary}\nExecution {}", exec.id),
    );
    event.link = Some((approval_url.to_owned(), REVIEW_BUTTON.to_owned()));
    event
}

/// The event of a person's decision on a held call, read back after it was recorded
/// (its summary says what a narrowed approval narrowed); `None` for a call that is not
/// approved or denied.
pub fn decided(exec: &Execution, redactor: &Redactor) -> Option<TrailEvent> {
    let reviewer = exec.reviewer.as_deref().unwrap_or("a reviewer");
    let message = exec
        .decision_message
        .as_deref()
        .filter(|m| !m.trim().is_empty())
        .map(|m| redactor.redact(m).into_owned());
    let summary = exec.summary.as_deref().unwrap_or(&exec.tool);
    let (step, title, body) = match exec.status {
        Status::Approved => (
            "approved",
            format!("Approved by {reviewer}"),
            match &message {
                Some(m) => format!("{summary}\nMessage: {m}"),
                None => summary.to_owned(),
            },
        ),
        Status::Denied => (
            "denied",
            format!("Denied by {reviewer}"),
            match &message {
                Some(m) => format!("denied: {m}\n{summary}"),
                None => format!("denied with no message\n{summary}"),
            },
        ),
        _ => return None,
    };
    Some(TrailEvent::new(exec, step, title, body))
}

/// The event of a held call whose time for a decision ran out: it never runs.
pub fn expired(exec: &Execution) -> TrailEvent {
    let summary = exec.summary.as_deref().unwrap_or(&exec.tool);
    TrailEvent::new(
        exec,
        "expired",
        "Approval expired".to_owned(),
        format!("no one decided in time; the call will not run\n{summary}"),
    )
}

/// The event of an approved call that the current policy blocks when it is re-checked.
pub fn blocked(exec: &Execution, reason: &str, redactor: &Redactor) -> TrailEvent {
    TrailEvent::new(
        exec,
        "blocked",
        "Blocked before it ran".to_owned(),
        redactor.redact(reason).into_owned(),
    )
}

/// The event of how a held call's run ended.
pub fn ran(
    exec: &Execution,
    status: Status,
    error: Option<&str>,
    redactor: &Redactor,
) -> TrailEvent {
    let title = match status {
        Status::Succeeded => "Ran: succeeded",
        Status::Failed => "Ran: failed",
        _ => "Ran: outcome unknown, check the provider",
    };
    let summary = exec.summary.as_deref().unwrap_or(&exec.tool);
    let body = match error {
        Some(e) => format!("{summary}\nError: {}", redactor.redact(e)),
        None => summary.to_owned(),
    };
    TrailEvent::new(exec, "ran", title.to_owned(), body)
}

/// Whether `exec` was held for a person, so its steps belong on the trail.
pub fn was_held(exec: &Execution) -> bool {
    exec.verdict == "hold"
}

/// `text` cut to what Plain takes in one text component (never empty).
fn clipped(text: String) -> String {
    let text = if text.trim().is_empty() {
        "(no details)".to_owned()
    } else {
        text
    };
    match text.char_indices().nth(MAX_TEXT_CHARS - 1) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// Queues an event in the caller's transaction. An event whose external id is already
/// queued is left as it is (false).
pub fn enqueue(conn: &Conn<'_>, event: &TrailEvent, now_ms: i64) -> crate::store::Result<bool> {
    let (url, label) = match &event.link {
        Some((url, label)) => (Some(url.as_str()), Some(label.as_str())),
        None => (None, None),
    };
    let added = cached_execute(
        conn,
        "INSERT INTO thread_event_outbox (external_id, thread_id, title, body, link_url, \
         link_label, next_attempt_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (external_id) DO NOTHING",
        params![
            event.external_id,
            event.thread_id,
            event.title,
            event.body,
            url,
            label,
            now_ms
        ],
    )?;
    // Every step of a held call's trail may change whether its thread waits for a
    // person, so its state labels are synced again.
    super::labels::touch(conn, &event.thread_id, now_ms)?;
    Ok(added == 1)
}

/// Events due for an attempt, fairly across threads and in each thread's order: at
/// most `per_thread` of a thread (its oldest unsent), taken round by round, `limit` in
/// all. An event waits while an earlier one of its thread is put off, so a thread's
/// trail reaches Plain in the order it happened.
pub fn due(
    conn: &Conn<'_>,
    now_ms: i64,
    per_thread: i64,
    limit: i64,
) -> crate::store::Result<Vec<TrailEvent>> {
    let mut stmt = conn.prepare_cached(
        "SELECT external_id, thread_id, title, body, link_url, link_label, attempts FROM ( \
           SELECT *, \
             row_number() OVER (PARTITION BY thread_id ORDER BY seq) AS turn, \
             max(next_attempt_ms) OVER (PARTITION BY thread_id ORDER BY seq \
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ready_at \
           FROM thread_event_outbox WHERE sent_at_ms IS NULL) AS pending \
         WHERE turn <= ?2 AND ready_at <= ?1 ORDER BY turn, seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![now_ms, per_thread, limit], |r| {
        let url: Option<String> = r.get(4)?;
        let label: Option<String> = r.get(5)?;
        Ok(TrailEvent {
            external_id: r.get(0)?,
            thread_id: r.get(1)?,
            title: r.get(2)?,
            body: r.get(3)?,
            link: url.zip(label),
            attempts: r.get(6)?,
        })
    })?;
    rows.collect()
}

/// Takes the events [`due`] names for one drainer: each one's next attempt moves to
/// `until_ms`, so no other instance sharing the database posts it meanwhile (and a
/// later event of its thread waits behind it, as behind one put off). An event another
/// drainer took first (its transaction committed first) is left out; one whose drainer
/// died mid-send is due again after `until_ms` (Plain takes its external id once).
pub fn claim(
    conn: &Conn<'_>,
    now_ms: i64,
    (per_thread, limit): (i64, i64),
    until_ms: i64,
) -> crate::store::Result<Vec<TrailEvent>> {
    let mut claimed = Vec::new();
    for event in due(conn, now_ms, per_thread, limit)? {
        let took = cached_execute(
            conn,
            "UPDATE thread_event_outbox SET next_attempt_ms = ?2 \
             WHERE external_id = ?1 AND sent_at_ms IS NULL AND next_attempt_ms <= ?3",
            params![event.external_id, until_ms, now_ms],
        )?;
        if took == 1 {
            claimed.push(event);
        }
    }
    Ok(claimed)
}

/// Records that Plain has the event.
pub fn sent(conn: &Conn<'_>, external_id: &str, now_ms: i64) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE thread_event_outbox SET sent_at_ms = ?2, attempts = attempts + 1 \
         WHERE external_id = ?1",
        params![external_id, now_ms],
    )?;
    Ok(())
}

/// Records a failed attempt and when to try again.
pub fn failed(
    conn: &Conn<'_>,
    external_id: &str,
    error: &str,
    next_attempt_ms: i64,
) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE thread_event_outbox SET last_error = ?2, next_attempt_ms = ?3, \
         attempts = attempts + 1 WHERE external_id = ?1",
        params![external_id, error, next_attempt_ms],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;

    fn event(thread: &str, n: u32) -> TrailEvent {
        TrailEvent {
            external_id: format!("ex_{thread}_{n}:held"),
            thread_id: ThreadId::parse(thread).expect("thread id"),
            title: "t".into(),
            body: "b".into(),
            link: None,
            attempts: 0,
        }
    }

    async fn due_ids(db: &Db, now: i64) -> Vec<String> {
        let due = db.read(move |c| due(c, now, 2, 50)).await.expect("due");
        due.into_iter().map(|e| e.external_id).collect()
    }

    #[tokio::test]
    async fn a_round_takes_two_of_each_thread_in_order_and_an_event_waits_behind_a_put_off_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("state.db")).expect("open");
        db.write(|c| {
            for n in 1..=5 {
                enqueue(c, &event("a", n), 0)?;
            }
            enqueue(c, &event("b", 1), 0)?;
            // The same external id again is not queued twice.
            assert!(!enqueue(c, &event("b", 1), 0)?);
            Ok(())
        })
        .await
        .expect("enqueue");
        assert_eq!(
            due_ids(&db, 10).await,
            ["ex_a_1:held", "ex_b_1:held", "ex_a_2:held"]
        );

        // The first of thread a is put off: the rest of a waits behind it, b does not.
        db.write(|c| failed(c, "ex_a_1:held", "plain is down", 1_000))
            .await
            .expect("failed");
        assert_eq!(due_ids(&db, 10).await, ["ex_b_1:held"]);
        assert_eq!(
            due_ids(&db, 1_000).await,
            ["ex_a_1:held", "ex_b_1:held", "ex_a_2:held"]
        );
        db.write(|c| sent(c, "ex_a_1:held", 1_000))
            .await
            .expect("sent");
        assert_eq!(
            due_ids(&db, 1_000).await,
            ["ex_a_2:held", "ex_b_1:held", "ex_a_3:held"]
        );
    }

    #[test]
    fn a_long_text_is_cut_to_what_plain_takes() {
        let cut = clipped("é".repeat(20_000));
        assert_eq!(cut.chars().count(), 10_000);
        assert!(cut.ends_with('…'));
        assert_eq!(clipped("  ".into()), "(no details)");
        assert_eq!(clipped("short".into()), "short");
    }
}
